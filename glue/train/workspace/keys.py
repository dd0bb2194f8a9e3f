"""Content-addressed names in the bucket, shared by the controller (writes code) and the VM (reads it).

A key is derived from the bytes it holds, so an object under it never changes and a second upload
of the same tree or the same dependency set is a no-op. Nothing under these prefixes is ever deleted
by the kit (a run's manifest may still point at it).
"""

from __future__ import annotations

CODE_PREFIX = "code/"
WHEELS_PREFIX = "wheels/"


def code_key(sha256: str) -> str:
    """The packed workdir (an uncompressed, deterministic tar) whose sha256 is `sha256`."""
    return f"{CODE_PREFIX}{sha256}.tar"


def code_index_key(sha256: str) -> str:
    """The package's file list (path, size), for `glue deploy --dry-run` and the command check."""
    return f"{CODE_PREFIX}{sha256}.json"


def wheelhouse_prefix(set_sha256: str) -> str:
    """Every wheel of one resolved dependency set, and its index.json (written last: the set is complete)."""
    return f"{WHEELS_PREFIX}{set_sha256}/"


def wheelhouse_index_key(set_sha256: str) -> str:
    return f"{wheelhouse_prefix(set_sha256)}index.json"

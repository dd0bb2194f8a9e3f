"""`glue doctor`'s lines (what was checked, whether it holds, the fix when it does not), and what a
backend's own checks found."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.errors import GlueError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Readiness:
    """A backend's doctor lines, and the bucket + credentials to probe with (None: nothing to probe
    without starting something, e.g. the local bucket server)."""

    checks: list[Check]
    bucket: BucketInfo | None = None
    credentials: BucketCredentials | None = None


def host_readiness(name: str, check_host: Callable[[], None], ok: str) -> Readiness:
    """A backend whose VMs run on this machine: its doctor line is its `check_host`, ✓ with `ok` or ✗
    with the check's own line (which names the fix)."""
    try:
        check_host()
    except GlueError as exc:
        return Readiness([Check(name, False, str(exc), "see the message")])
    return Readiness([Check(name, True, ok)])

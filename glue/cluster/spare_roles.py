"""Which warm spare serves in which lost VM's place, until terraform's state says so itself.

A recovery takes a spare at once (no terraform in its path): it records here that spare <prefix>-spare-K
(VM id X) now serves as the lost VM L. Every lookup of the cluster's VMs (glue.cluster.current) applies
the record: X answers to L, the lost VM's entry is gone. The spare pool's refill
(glue.operations.spares) then moves X's state to L's address, renames it in place, and drops the entry.
This module is the record's only reader and writer (<home>/spares.json, replaced whole, under a lock).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from glue.errors import GlueError
from glue.infra.inventory import Host


@dataclass(frozen=True)
class Taken:
    """Spare `spare` (VM `id`) serves as `name`, in place of VM `old_id` (None: nothing left to delete),
    since `at`; it waited idle from `idle_since` (when it was converged; None: not known)."""

    name: str
    spare: str
    id: str
    old_id: str | None
    run: str
    at: str
    idle_since: str | None = None


def _path(home: Path) -> Path:
    return home / "spares.json"


@contextmanager
def locked(home: Path) -> Iterator[None]:
    """One taker or refill at a time: two recoveries never take the same spare."""
    fd = os.open(home / ".spares.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def taken(home: Path) -> list[Taken]:
    try:
        raw = json.loads(_path(home).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise GlueError(f"{_path(home)} cannot be read ({exc}): it says which spare serves which lost VM; "
                        "restore it, or remove it and run `glue up` (the spares taken become spares again)") from None
    try:
        return [Taken(**t) for t in raw["taken"]]
    except (KeyError, TypeError) as exc:
        raise GlueError(f"{_path(home)} is not a spare record ({exc}); remove it and run `glue up`") from None


def _save(home: Path, entries: list[Taken]) -> None:
    tmp = _path(home).with_suffix(".tmp")
    tmp.write_text(json.dumps({"taken": [asdict(t) for t in entries]}, indent=1))
    tmp.replace(_path(home))  # a reader never sees half a record


def add(home: Path, entries: list[Taken]) -> None:
    """Record spares taken (call under `locked`)."""
    _save(home, [*taken(home), *entries])


def drop(home: Path, names: set[str]) -> None:
    """Forget the entries of these VM names: terraform's state says it now (call under `locked`)."""
    _save(home, [t for t in taken(home) if t.name not in names])


def now(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).isoformat(timespec="seconds")


def applied(home: Path, hosts: list[Host]) -> list[Host]:
    """`hosts` (terraform's view) as they serve now: each taken spare under the lost VM's name."""
    entries = taken(home)
    if not entries:
        return hosts
    by_name = {h.name: h for h in hosts}
    for t in entries:
        spare = by_name.get(t.spare)
        if by_name.get(t.name) is not None and by_name[t.name].id == t.id:
            continue  # terraform's state says it already
        by_name.pop(t.name, None)  # the lost VM's entry: no longer this name's VM
        if spare is not None and spare.id == t.id:
            del by_name[t.spare]
            by_name[t.name] = replace(spare, name=t.name)
    return [by_name[n] for n in sorted(by_name)]

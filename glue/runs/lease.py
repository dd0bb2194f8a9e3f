"""One writer per run: a lease in the bucket that deploy, recover and drill hold while they change a run.

S3-compatible stores do not all honour conditional writes (rclone's `serve s3` ignores If-None-Match),
so the lease is built from plain PUT and LIST:

  lease/<gen>/claim-<token>.json   a contender's claim on generation <gen> (under the run's prefix)
  lease/<gen>/released.json        written by the winner when it is done
  (keys: glue.train.layout; read and written through RunStore's lease methods)

To take the lease a contender reads the newest generation; if it is held (claimed, not released, not
expired, and its holder not a dead process on this machine) it refuses, naming the holder. Otherwise
it claims the next generation, waits `SETTLE_S`, and lists that generation's claims: the winner is
the claim the store timestamped first (one clock, the server's), ties broken by token. Every
contender computes the same winner from the same listing; a claim that lands after the winner
listed is later by the server's clock and loses.

The lease keeps controllers apart. The trainer is fenced separately: before each checkpoint commit it
checks that no newer attempt of its run exists (glue.train.checkpoint.fence), so an attempt that was replaced
while paused can never commit again.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from glue.errors import GlueError
from glue.process import pid_alive
from glue.runs.store import RunStore, parse_iso, utc_iso
from glue.train.layout import is_lease_claim, is_lease_release, lease_claim_name

SETTLE_S = float(os.environ.get("GPUKIT_LEASE_SETTLE_S", "1.5"))  # > the store's timestamp resolution (1 s)
TTL_S = 6 * 3600.0  # a lease whose holder vanished elsewhere is free again after this

_HELD: dict[tuple[str, str, str], tuple[Lease, int]] = {}  # (endpoint, bucket, run) -> (lease, depth)
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Lease:
    run: str
    gen: int
    token: str
    holder: str
    op: str
    expires_at: str


def _holder() -> str:
    return f"{os.environ.get('USER') or 'root'}@{socket.gethostname()} pid {os.getpid()}"


def _claims(store: RunStore, gen: int | None = None) -> dict[int, list[dict[str, Any]]]:
    """gen -> its entries, claims and release (each with the server's LastModified)."""
    return store.lease_entries(gen)


def _winner(store: RunStore, gen: int, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    claims = sorted((e for e in entries if is_lease_claim(e["name"])), key=lambda e: (e["modified"], e["name"]))
    for entry in claims:  # the first claim that still reads back (a torn write is skipped)
        doc = store.lease_doc(gen, entry["name"])
        if doc:
            return dict(doc)
    return None


def _stale(doc: dict[str, Any]) -> bool:
    """Expired, or held by a process of this machine that no longer exists (a Ctrl-C'd recover)."""
    if parse_iso(doc["expires_at"]) < datetime.now(UTC):
        return True
    if doc.get("host") == socket.gethostname() and isinstance(doc.get("pid"), int):
        return not pid_alive(doc["pid"])
    return False


def current(store: RunStore) -> dict[str, Any] | None:
    """The holder's claim when the run's lease is held now, else None."""
    gens = _claims(store)
    if not gens:
        return None
    gen = max(gens)
    if any(is_lease_release(e["name"]) for e in gens[gen]):
        return None
    doc = _winner(store, gen, gens[gen])
    return None if doc is None or _stale(doc) else {**doc, "gen": gen}


def held_elsewhere(store: RunStore) -> dict[str, Any] | None:
    """The holder's claim when another process holds the run's lease now (a deploy or recover under way)."""
    held = current(store)
    return held if held is not None and held.get("holder") != _holder() else None


def acquire(store: RunStore, op: str) -> Lease:
    """Take the run's lease for `op` or raise one line naming who holds it."""
    gens = _claims(store)
    top = max(gens) if gens else 0
    if gens:
        held = current(store)
        if held is not None:
            raise GlueError(f"run {store.run} is being changed by {held['holder']} ({held['op']}, since "
                            f"{held['created_at']}); wait for it to finish. The lease frees itself at "
                            f"{held['expires_at']} or when that process is gone")
    gen = top + 1
    token = secrets.token_hex(8)
    now = datetime.now(UTC)
    doc = {"run": store.run, "gen": gen, "token": token, "holder": _holder(), "host": socket.gethostname(),
           "pid": os.getpid(), "op": op, "created_at": utc_iso(now),
           "expires_at": utc_iso(now + timedelta(seconds=TTL_S))}
    store.put_lease_claim(gen, token, doc)
    time.sleep(SETTLE_S)
    entries = _claims(store, gen).get(gen, [])
    winner = _winner(store, gen, entries)
    if winner is None or winner.get("token") != token:
        who = winner or {"holder": "another controller", "op": "?", "created_at": "?"}
        raise GlueError(f"run {store.run} is being changed by {who['holder']} ({who['op']}, since "
                        f"{who['created_at']}); it took the lease a moment before this command")
    return Lease(store.run, gen, token, str(doc["holder"]), op, str(doc["expires_at"]))


def release(store: RunStore, lease: Lease, new_run: bool = False) -> None:
    """Free the lease. For a `new_run` whose manifest was not written the command created nothing: its claim
    is removed instead, so a refused new run leaves no trace in the bucket."""
    if new_run and not store.exists() \
            and [e["name"] for e in _claims(store, lease.gen).get(lease.gen, [])] == [lease_claim_name(lease.token)]:
        try:
            store.delete_lease_claim(lease.gen, lease.token)
            return
        except GlueError:
            pass  # then release it the ordinary way
    store.put_lease_release(lease.gen, {"token": lease.token, "released_at": utc_iso()})


@contextmanager
def held(store: RunStore, op: str, new_run: bool = False) -> Iterator[Lease]:
    """Hold the run's lease for the block. Re-entrant within one process (drill -> deploy, recover).
    `new_run`: see release()."""
    key = (store.info.endpoint, store.info.name, store.run)
    with _LOCK:
        mine = _HELD.get(key)
        if mine is not None:
            _HELD[key] = (mine[0], mine[1] + 1)
    if mine is not None:
        try:
            yield mine[0]
        finally:
            with _LOCK:
                lease, depth = _HELD[key]
                _HELD[key] = (lease, depth - 1)
        return
    lease = acquire(store, op)
    with _LOCK:
        _HELD[key] = (lease, 1)
    try:
        yield lease
    finally:
        with _LOCK:
            del _HELD[key]
        release(store, lease, new_run)

"""One writer per run: the lease in the (real rclone) bucket under concurrent contenders."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from glue.errors import GlueError
from glue.runs import lease
from glue.runs.store import RunStore

pytestmark = pytest.mark.integration


def _store(local_bucket: Any) -> RunStore:
    return RunStore(local_bucket.info, local_bucket.creds, f"lease-{uuid.uuid4().hex[:8]}")


def test_simultaneous_contenders_exactly_one_wins(local_bucket: Any) -> None:
    store = _store(local_bucket)
    start = threading.Barrier(4)
    won: list[lease.Lease] = []
    refused: list[str] = []

    def contend() -> None:
        own = RunStore(store.info, store.creds, store.run)  # a boto3 client per contender, as per process
        start.wait()
        try:
            won.append(lease.acquire(own, "recover"))
        except GlueError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 3, (won, refused)
    assert all("is being changed by" in r and "recover" in r and "\n" not in r for r in refused)
    assert lease.current(store)["token"] == won[0].token


def test_a_later_contender_is_refused_until_release(local_bucket: Any) -> None:
    store = _store(local_bucket)
    first = lease.acquire(store, "recover")
    with pytest.raises(GlueError, match=r"being changed by .* pid \d+ \(recover"):
        lease.acquire(store, "deploy")
    lease.release(store, first)
    assert lease.current(store) is None
    second = lease.acquire(store, "deploy")
    assert second.gen == first.gen + 1


def test_a_holder_that_died_on_this_machine_frees_the_lease(local_bucket: Any) -> None:
    store = _store(local_bucket)
    taken = lease.acquire(store, "recover")
    claim = f"lease/{taken.gen:06d}/claim-{taken.token}.json"  # the key as existing buckets hold it
    doc = store.get_json(claim)
    store.put_lease_claim(taken.gen, taken.token, {**doc, "pid": 2**22 + 12345})  # no such process
    assert lease.current(store) is None
    assert lease.acquire(store, "recover").gen == taken.gen + 1


def test_a_holder_killed_but_not_yet_reaped_frees_the_lease(local_bucket: Any) -> None:
    """A SIGKILLed watcher whose parent has not reaped it (a zombie) holds nothing: the next watcher
    must be able to act on the run at once, not after the lease's 6 h."""
    store = _store(local_bucket)
    holder = subprocess.Popen(["sleep", "600"])
    try:
        taken = lease.acquire(store, "watch")
        doc = store.lease_doc(taken.gen, f"claim-{taken.token}.json")
        store.put_lease_claim(taken.gen, taken.token, {**doc, "pid": holder.pid})
        assert lease.current(store) is not None  # alive: the lease holds
        holder.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.05)
        assert lease.current(store) is None
        assert lease.acquire(store, "watch").gen == taken.gen + 1
    finally:
        holder.kill()
        holder.wait()


def test_held_is_reentrant_and_a_refused_new_run_leaves_nothing(local_bucket: Any) -> None:
    store = _store(local_bucket)
    with lease.held(store, "drill") as outer, lease.held(store, "recover") as inner:
        assert inner == outer
    assert lease.current(store) is None
    fresh = _store(local_bucket)
    with pytest.raises(RuntimeError), lease.held(fresh, "deploy", new_run=True):
        raise RuntimeError("the deploy failed before writing its manifest")
    assert fresh.keys() == {}

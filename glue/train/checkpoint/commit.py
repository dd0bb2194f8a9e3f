"""The background half of a save: the commit protocol that makes a checkpoint count only when whole.

One object per component under `ckpt/step-<N>/`, every object read back and checked against the
size and sha256 it was written with, then COMMIT.json written LAST (and read back). Nothing is
renamed. Older checkpoints are pruned only after the new one is committed, and a pruned checkpoint
stops counting (its COMMIT.json goes first) before any of its objects are deleted. Ranks >= 1
upload their objects plus a part record (`rank<r>.json`); rank 0 waits for every part, through the
bucket, and commits for all.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, cast

import torch

from glue.train.checkpoint import hold_point
from glue.train.checkpoint.format import (
    COMMIT,
    FORMAT,
    Commit,
    ObjectRef,
    list_step,
    list_steps,
    object_key,
    rank_part_key,
    step_prefix,
    validate_step,
)
from glue.train.checkpoint.invalid import move_aside
from glue.train.errors import CheckpointError, StorageError
from glue.train.storage.buffers import HashingWriter
from glue.train.storage.target import Storage
from glue.train.utc import iso, utc_now

log = logging.getLogger("glue.train")
IO_DEPTH = 2  # objects uploaded / read back concurrently by one save


@dataclass
class Piece:
    """One object of a save: a component's state (rank None: shared, written by rank 0 alone)."""

    component: str
    rank: int | None
    state: Any


@dataclass
class SaveJob:
    """What the training thread hands the background thread: host copies of this rank's states."""

    step: int
    nonce: str
    pieces: list[Piece]
    timings: dict[str, Any]
    restore: dict[str, Any] | None = None
    sharded: list[str] = field(default_factory=list)  # components saved through DCP


def _busy(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the (start, end) spans was running."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class _Clock:
    """The seconds of each protocol step, recorded into the save's timings apart from the steps."""

    def __init__(self, timings: dict[str, Any]) -> None:
        self.timings = timings
        self.started = time.monotonic()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.timings[f"{name}_s"] = round(time.monotonic() - t0, 6)

    def since_start(self) -> float:
        return round(time.monotonic() - self.started, 6)


def write_step(
    st: Storage, job: SaveJob, *, rank: int, world_size: int, io_pool: ThreadPoolExecutor, rank_timeout_s: float
) -> None:
    """Write this rank's objects of one save; rank 0 then verifies every rank's objects and commits.

    The protocol, step by step: retract (a re-saved step stops counting first), upload (serialize and
    put this rank's objects), rank part (ranks >= 1: their object list, and done), collect (rank 0:
    every rank's part), verify (read every object back), commit (strays out, COMMIT.json written last
    and read back). Fills job.timings. Returns once this rank's share is durable (rank 0: once
    COMMIT.json is).
    """
    clock = _Clock(job.timings)
    with clock.step("prepare"):
        _retract(st, job.step, rank)
    refs = _upload(st, job, rank, io_pool)
    if rank != 0:
        _write_rank_part(st, job, rank, refs)
        return
    parts, rank_timings = collect_rank_parts(st, job, refs, world_size=world_size, timeout_s=rank_timeout_s)
    commit = _commit_record(job, refs, parts, world_size)
    hold_point.reached("verify", job.step)
    with clock.step("verify"):
        _read_back(st, job.step, commit, io_pool)
    with clock.step("commit"):
        _drop_strays(st, job.step, commit)
        if rank_timings:
            job.timings["ranks"] = rank_timings
        job.timings["restore"] = job.restore
        job.timings["background_s"] = clock.since_start()  # up to writing COMMIT.json
        commit.timings = job.timings
        _write_commit(st, job.step, commit)
    log.info(
        "checkpoint step %d committed to %s (%.1f MB, upload %.2fs, verify %.2fs)",
        job.step,
        st.describe(),
        job.timings["bytes"] / 1e6,
        job.timings["upload_s"],
        job.timings["verify_s"],
    )


def commit_files(st: Storage, step: int, component: str, files: list[tuple[str, bytes]],
                 io_pool: ThreadPoolExecutor, timings: dict[str, Any]) -> Commit:
    """The protocol for raw files (a sealed framework checkpoint folder), written by one process: each
    file put as is under its key, every one read back and checked, COMMIT.json written last."""
    import hashlib

    clock = _Clock(timings)
    with clock.step("prepare"):
        _retract(st, step, 0)
    prefix = step_prefix(step)
    refs: list[ObjectRef] = []
    with clock.step("upload"):
        for key, data in files:
            refs.append(ObjectRef(key, len(data), hashlib.sha256(data).hexdigest()))
        for _ in io_pool.map(lambda kd: st.put(prefix + kd[0], kd[1]), files):
            pass
    commit = Commit(step=step, created_at=iso(utc_now()), world_size=1, components={component: refs})
    with clock.step("verify"):
        _read_back(st, step, commit, io_pool)
    with clock.step("commit"):
        _drop_strays(st, step, commit)
        timings["bytes"] = sum(r.size for r in refs)
        commit.timings = timings
        _write_commit(st, step, commit)
    return commit


def _retract(st: Storage, step: int, rank: int) -> None:
    """Re-saving a step: its COMMIT.json goes before any of its objects change (rank 0 owns it)."""
    if rank == 0 and COMMIT in list_step(st, step):
        st.delete([step_prefix(step) + COMMIT])


def _upload(st: Storage, job: SaveJob, rank: int, io_pool: ThreadPoolExecutor) -> dict[str, list[ObjectRef]]:
    """Serialize each component's state (hashed as it is written) and put it; the next object is serialized
    while the previous ones upload, at most IO_DEPTH of them waiting in memory. Records serialize_s,
    upload_s (seconds with an upload running) and bytes."""
    prefix = step_prefix(job.step)
    refs: dict[str, list[ObjectRef]] = {}
    ser = 0.0
    nbytes = 0
    uploads: list[Future[None]] = []
    spans: list[tuple[float, float]] = []

    def put(key: str, blob: bytearray) -> None:
        t0 = time.monotonic()
        st.put(key, blob)
        spans.append((t0, time.monotonic()))

    try:
        while job.pieces:
            piece = job.pieces.pop(0)
            name, obj_rank = piece.component, piece.rank
            key = object_key(name, obj_rank)
            t0 = time.monotonic()
            writer = HashingWriter()
            torch.save(piece.state, cast(IO[bytes], writer))
            del piece
            blob, sha = writer.result()
            del writer
            ser += time.monotonic() - t0
            nbytes += len(blob)
            refs.setdefault(name, []).append(ObjectRef(key, len(blob), sha, obj_rank))
            if len([u for u in uploads if not u.done()]) >= IO_DEPTH:
                wait(uploads, return_when=FIRST_COMPLETED)
            uploads.append(io_pool.submit(put, prefix + key, blob))
            del blob
            if len(uploads) == 1 and job.pieces and hold_point.armed_at("upload", job.step):
                uploads[0].result()  # held with exactly one object in the target
                hold_point.reached("upload", job.step)
    finally:
        wait(uploads)  # never leave an upload running behind a failure
    for u in uploads:
        u.result()  # raises the first failure
    job.timings.update(serialize_s=round(ser, 6), upload_s=round(_busy(spans), 6), bytes=nbytes)
    return refs


def _write_rank_part(st: Storage, job: SaveJob, rank: int, refs: dict[str, list[ObjectRef]]) -> None:
    """Ranks >= 1: the list of their objects, which rank 0 verifies and commits for all."""
    part = {
        "format": FORMAT,
        "step": job.step,
        "nonce": job.nonce,
        "rank": rank,
        "components": {n: [o.as_json() for o in objs] for n, objs in refs.items()},
        "timings": job.timings,
    }
    st.put(step_prefix(job.step) + rank_part_key(rank), json.dumps(part).encode())


def _commit_record(job: SaveJob, refs: dict[str, list[ObjectRef]], parts: list[ObjectRef], world_size: int) -> Commit:
    for objs in refs.values():
        objs.sort(key=lambda o: -1 if o.rank is None else o.rank)
    return Commit(step=job.step, created_at=iso(utc_now()), world_size=world_size, components=refs,
                  rank_parts=parts, timings={}, sharded=sorted(job.sharded))


def _read_back(st: Storage, step: int, commit: Commit, io_pool: ThreadPoolExecutor) -> None:
    """Every object, every rank's, read back and checked against the size and sha256 it was written with."""
    prefix = step_prefix(step)

    def check(ref: ObjectRef) -> None:
        data, sha = st.get(prefix + ref.key, ref.size)
        if len(data) != ref.size or sha != ref.sha256:
            raise CheckpointError(f"read-back of {prefix + ref.key} does not match what was written")

    for _ in io_pool.map(check, commit.objects()):
        pass


def _drop_strays(st: Storage, step: int, commit: Commit) -> None:
    """Leftovers of an earlier attempt at this step: objects the commit does not list."""
    listed = {o.key for o in commit.objects()} | {COMMIT}
    strays = [step_prefix(step) + k for k in list_step(st, step) if k not in listed]
    if strays:
        st.delete(strays)


def _write_commit(st: Storage, step: int, commit: Commit) -> None:
    """COMMIT.json, written last and read back: from here on the step counts."""
    key = step_prefix(step) + COMMIT
    body = commit.to_json()
    hold_point.reached("commit", step)
    st.put(key, body)
    hold_point.reached("committed", step)
    back, _ = st.get(key, len(body))
    if bytes(back) != body:
        raise CheckpointError(f"read-back of {key} does not match what was written")


def collect_rank_parts(
    st: Storage, job: SaveJob, refs: dict[str, list[ObjectRef]], *, world_size: int, timeout_s: float
) -> tuple[list[ObjectRef], dict[str, Any]]:
    """Rank 0 waits for every other rank's part of this save (the bucket is the rendezvous: no
    collective runs on the background thread) and adds the objects each part lists to refs."""
    if world_size == 1:
        return [], {}
    prefix = step_prefix(job.step)
    pending = set(range(1, world_size))
    parts: list[ObjectRef] = []
    timings: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while pending:
        listing = list_step(st, job.step)
        for r in sorted(pending):
            key = rank_part_key(r)
            if key not in listing:
                continue
            data, sha = st.get(prefix + key, listing[key])
            try:
                raw = json.loads(bytes(data))
            except ValueError:
                continue  # still being written (filesystem target)
            if raw.get("nonce") != job.nonce or raw.get("step") != job.step:
                continue  # a leftover of an earlier attempt at this step
            for name, objs in raw.get("components", {}).items():
                refs.setdefault(name, []).extend(ObjectRef.from_json(o) for o in objs)
            parts.append(ObjectRef(key, len(data), sha, r))
            timings[str(r)] = raw.get("timings", {})
            pending.discard(r)
        if pending:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"ranks {sorted(pending)} did not upload their part of step {job.step} within {timeout_s:.0f}s"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
    return parts, timings


def refuse_rewind(st: Storage, step: int, restored: int | None) -> None:
    """A process that restored step `restored` may not save a step at or below it over a committed one: a
    trainer that restored its state but counts steps from the start again would replace the run's own
    history (the very checkpoint it resumed from, among others) with another trajectory."""
    if restored is not None and step <= restored and COMMIT in list_step(st, step):
        raise CheckpointError(f"refusing to overwrite committed checkpoint step {step}: this process resumed from "
                              f"step {restored}, so its step counter went back; continue counting from {restored + 1}")


def prune(st: Storage, new_step: int, *, keep_last: int, stale_steps: set[int], keep: set[int] | None = None) -> None:
    """Keep the newest keep_last valid checkpoints (the new, committed one included), and the valid ones
    in `keep` (the step the process resumed from) besides.

    stale_steps: steps newer than new_step that restore saw invalid; they are deleted too (other
    newer step directories may be other ranks' saves in progress). Pruned steps leave the set.
    """
    try:
        steps = list_steps(st)
        older_valid: list[int] = []
        doomed: list[int] = []
        for s in sorted(steps, reverse=True):
            if s == new_step:
                continue
            if s > new_step:
                if s in stale_steps:
                    doomed.append(s)
                continue
            status = validate_step(st, s, steps[s], deep=False)
            (older_valid if status.valid else doomed).append(s)
        corrupt = {s for s in doomed if COMMIT in steps[s]}  # committed once, invalid now: evidence
        doomed += [s for s in older_valid[keep_last - 1 :] if s not in (keep or set())]
        stamp = utc_now().strftime("%Y%m%dT%H%M%S.%fZ")
        for s in doomed:
            objs = steps[s]
            if s in corrupt:
                move_aside(st, s, objs, stamp)  # kept under ckpt-invalid/ for inspection, never pruned away
            else:
                if COMMIT in objs:
                    st.delete([step_prefix(s) + COMMIT])
                    hold_point.reached("prune", new_step)
                st.delete([step_prefix(s) + k for k in objs if k != COMMIT])
            stale_steps.discard(s)
    except StorageError as exc:
        # The new checkpoint is committed; pruning is retried after the next one.
        log.warning("pruning old checkpoints failed (will retry next save): %s", exc)

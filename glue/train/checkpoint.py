"""The Checkpointer: named state components, asynchronous full-state saves, validated restores.

Commit protocol (DESIGN.md "Checkpoints"): one object per component under `ckpt/step-<N>/`, every
object read back and checked, then COMMIT.json (sizes + sha256 of every object) written LAST.
Nothing is renamed. Older checkpoints are pruned only after the new one has been verified, and a
checkpoint stops counting (its COMMIT.json goes first) before any of its objects are deleted.

Save path: the training thread copies state to host memory and returns; one background thread
serializes, uploads, verifies, commits and prunes. At most one save is in flight: the next save()
waits for it (back-pressure, bounded memory) and raises if it failed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import secrets
import signal
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, Protocol, cast

import torch
import torch.distributed as dist
from boto3.s3.transfer import TransferConfig

from glue.train.buffers import BlobReader
from glue.train.ckpt_format import (
    COMMIT,
    FORMAT,
    CheckpointStatus,
    Commit,
    ObjectRef,
    check_checkpoints,
    list_step,
    list_steps,
    object_key,
    rank_manifest_key,
    record_incident,
    step_prefix,
    validate_step,
)
from glue.train.errors import (
    CheckpointError,
    CorruptCheckpointError,
    SaveFailedError,
    StateMismatchError,
    StorageError,
)
from glue.train.retry import RetryPolicy
from glue.train.s3_client import CredentialsCallback
from glue.train.snapshot import HostSnapshotter, check_compatible
from glue.train.storage import Storage, open_target
from glue.train.utc import iso, utc_now

log = logging.getLogger("glue.train")
_IO_DEPTH = 2  # objects uploaded / read back concurrently by one save


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass
class _Component:
    name: str
    obj: Stateful
    per_rank: bool


@dataclass
class _Job:
    step: int
    nonce: str
    states: dict[str, Any]
    per_rank: dict[str, bool]
    timings: dict[str, Any]
    restore: dict[str, Any] | None = None


@dataclass
class RestoreReport:
    step: int
    skipped: list[CheckpointStatus] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)


def _is_stateful_dataloader(obj: object) -> bool:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return False
    return isinstance(obj, StatefulDataLoader)


def _busy(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the (start, end) spans was running."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _load_priority(obj: object) -> int:
    # Components we cannot validate fully load first; the model loads last, so an error in any
    # other component leaves the model untouched.
    if isinstance(obj, torch.nn.Module):
        return 3
    if isinstance(obj, torch.optim.Optimizer):
        return 2
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return 1
    return 0


_live: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _flush_all_at_exit() -> None:
    for ckpt in list(_live):
        ckpt._flush_quietly("interpreter exit")


# Run before concurrent.futures stops accepting work at interpreter exit (boto3's transfer
# threads need it), i.e. before non-daemon threads are joined; plain atexit would be too late.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_flush_all_at_exit)
else:  # pragma: no cover - CPython has had it since 3.9
    import atexit

    atexit.register(_flush_all_at_exit)


class Checkpointer:
    """Full-state checkpoints of named components to `s3://bucket/prefix` or a directory.

    Layout: `<target>/ckpt/step-<N>/<name>.pt` (shared, written by rank 0),
    `<name>.rank<r>.pt` (per-rank: RNG, data position), `COMMIT.json` last;
    incidents in `<target>/incidents/`.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        keep_last: int = 2,
        components: Mapping[str, Stateful] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        async_save: bool = True,
        endpoint_url: str | None = None,
        credentials: CredentialsCallback | None = None,
        region: str | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryPolicy | None = None,
        weights_only: bool = True,
        handle_sigterm: bool = True,
        sigterm_timeout_s: float = 120.0,
        rank_timeout_s: float = 600.0,
        storage: Storage | None = None,
    ) -> None:
        if keep_last < 2:
            raise CheckpointError(f"keep_last must be at least 2 (got {keep_last}): the previous one is the fallback")
        self.target = os.fspath(target)
        self.storage: Storage = storage or open_target(
            target, endpoint_url=endpoint_url, credentials=credentials, region=region, transfer=transfer, retry=retry
        )
        self.keep_last = keep_last
        self.rank = rank if rank is not None else (dist.get_rank() if _dist_ready() else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if _dist_ready() else 1)
        if not 0 <= self.rank < self.world_size:
            raise CheckpointError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.async_save = async_save
        self.weights_only = weights_only
        self.sigterm_timeout_s = sigterm_timeout_s
        self.rank_timeout_s = rank_timeout_s
        self._components: dict[str, _Component] = {}
        self._snap = HostSnapshotter()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpukit-ckpt")
        self._io = ThreadPoolExecutor(max_workers=_IO_DEPTH, thread_name_prefix="gpukit-ckpt-io")
        self._inflight: tuple[int, Future[None]] | None = None
        self._closed = False
        self._saves = 0
        self._restored_step: int | None = None
        self._stale_steps: set[int] = set()
        self._pending_restore: dict[str, Any] | None = None
        self.last_committed_step: int | None = None
        self.last_save_timings: dict[str, Any] = {}
        self.last_restore: RestoreReport | None = None
        for name, obj in (components or {}).items():
            self.register(name, obj)
        self._prev_sigterm: Any = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        _live.add(self)

    # -- components --------------------------------------------------------------------------

    def register(self, name: str, obj: Any, *, per_rank: bool | None = None) -> Any:
        """Add a component (anything with state_dict()/load_state_dict()); returns obj.

        per_rank defaults to True for RNGState, ResumableSampler and StatefulDataLoader: every rank
        saves and restores its own. Everything else is shared and saved by rank 0 only.
        """
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name) or name.startswith("rank"):
            raise CheckpointError(f"component name {name!r} must be [A-Za-z0-9_-]+ and not start with 'rank'")
        if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
            raise CheckpointError(f"component {name!r} has no state_dict()/load_state_dict()")
        if name in self._components:
            raise CheckpointError(f"component {name!r} is already registered")
        if per_rank is None:
            per_rank = bool(getattr(obj, "checkpoint_per_rank", False)) or _is_stateful_dataloader(obj)
        self._components[name] = _Component(name, obj, per_rank)
        return obj

    # -- save --------------------------------------------------------------------------------

    def save(self, step: int, *, blocking: bool = False) -> None:
        """Checkpoint the state after `step`. Returns once the state is copied to host memory
        (blocking=True: once it is committed). Raises SaveFailedError if the previous save failed."""
        self._check_open()
        if step < 0:
            raise CheckpointError(f"step must be >= 0 (got {step})")
        if not self._components:
            raise CheckpointError("no components registered: call register() before save()")
        t0 = time.monotonic()
        self._wait_previous(None)
        wait_s = time.monotonic() - t0
        if step == self._restored_step and self._saves == 0:
            # That exact state is already committed; rewriting it would briefly leave it invalid.
            log.info("step %d was just restored from a valid checkpoint; not saving it again", step)
            return
        nonce = self._agree_nonce()
        t1 = time.monotonic()
        mine = [c for c in self._components.values() if c.per_rank or self.rank == 0]
        states = self._snap.copy({c.name: c.obj.state_dict() for c in mine})
        snapshot_s = time.monotonic() - t1
        job = _Job(
            step=step,
            nonce=nonce,
            states=states,
            per_rank={c.name: c.per_rank for c in mine},
            timings={"wait_s": round(wait_s, 6), "snapshot_s": round(snapshot_s, 6)},
            restore=self._pending_restore,
        )
        self._pending_restore = None
        self._saves += 1
        if self.async_save:
            self._inflight = (step, self._executor.submit(self._run, job))
            if blocking:
                self.flush()
        else:
            fut: Future[None] = Future()
            self._inflight = (step, fut)
            try:
                self._run(job)
                fut.set_result(None)
            except (CheckpointError, OSError, RuntimeError) as exc:
                fut.set_exception(exc)
            self.flush()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the in-flight save is committed; raise SaveFailedError if it failed."""
        self._wait_previous(timeout)

    def close(self) -> None:
        """Flush, stop the uploader and restore the previous SIGTERM handler."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            self._io.shutdown(wait=True)
            if self._prev_sigterm is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            _live.discard(self)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed")

    def _wait_previous(self, timeout: float | None) -> None:
        if self._inflight is None:
            return
        step, fut = self._inflight
        try:
            exc = fut.exception(timeout)
        except TimeoutError as err:
            raise CheckpointError(f"checkpoint of step {step} still uploading after {timeout:.0f}s") from err
        self._inflight = None
        if exc is not None:
            raise SaveFailedError(step, exc) from exc

    def _flush_quietly(self, why: str) -> None:
        if self._closed or self._inflight is None:
            return
        step = self._inflight[0]
        log.info("%s: waiting for the checkpoint of step %d to commit", why, step)
        try:
            self.flush(self.sigterm_timeout_s)
        except CheckpointError as exc:
            log.error("%s: %s", why, exc)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._flush_quietly("SIGTERM")
        prev = self._prev_sigterm
        signal.signal(signal.SIGTERM, prev if prev is not None else signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)  # default action: terminate, as if we were not here

    def _agree_nonce(self) -> str:
        # Ranks must recognise each other's parts of *this* save, not leftovers of an earlier
        # attempt at the same step: rank 0 picks an id and broadcasts it (tiny collective).
        token = secrets.token_hex(8)
        if self.world_size > 1 and _dist_ready():
            box: list[Any] = [token]
            dist.broadcast_object_list(box, src=0)
            return str(box[0])
        return token if self.world_size == 1 else "unsynchronised"

    # -- the background half of a save --------------------------------------------------------

    def _run(self, job: _Job) -> None:
        st = self.storage
        prefix = step_prefix(job.step)
        t = job.timings
        t_start = time.monotonic()
        if self.rank == 0 and COMMIT in list_step(st, job.step):
            st.delete([prefix + COMMIT])  # re-saving a step: it stops counting before it changes
        t["prepare_s"] = round(time.monotonic() - t_start, 6)
        refs: dict[str, list[ObjectRef]] = {}
        ser = 0.0
        nbytes = 0
        # Serialize the next object while the previous one uploads; at most _IO_DEPTH serialized
        # objects wait in memory at a time.
        uploads: list[Future[None]] = []
        spans: list[tuple[float, float]] = []

        def put(key: str, blob: bytes) -> None:
            t0 = time.monotonic()
            st.put(key, blob)
            spans.append((t0, time.monotonic()))

        try:
            for name in list(job.states):
                state = job.states.pop(name)
                rank = self.rank if job.per_rank[name] else None
                key = object_key(name, rank)
                t0 = time.monotonic()
                buf = io.BytesIO()
                torch.save(state, buf)
                del state
                blob = buf.getvalue()
                del buf
                sha = hashlib.sha256(blob).hexdigest()
                ser += time.monotonic() - t0
                nbytes += len(blob)
                refs.setdefault(name, []).append(ObjectRef(key, len(blob), sha, rank))
                if len([u for u in uploads if not u.done()]) >= _IO_DEPTH:
                    wait(uploads, return_when=FIRST_COMPLETED)
                uploads.append(self._io.submit(put, prefix + key, blob))
                del blob
        finally:
            wait(uploads)  # never leave an upload running behind a failure
        for u in uploads:
            u.result()  # raises the first failure
        up = _busy(spans)
        t.update(serialize_s=round(ser, 6), upload_s=round(up, 6), bytes=nbytes)
        if self.rank != 0:
            part = {
                "format": FORMAT,
                "step": job.step,
                "nonce": job.nonce,
                "rank": self.rank,
                "components": {n: [o.as_json() for o in objs] for n, objs in refs.items()},
                "timings": t,
            }
            st.put(prefix + rank_manifest_key(self.rank), json.dumps(part).encode())
            self.last_committed_step = job.step
            self.last_save_timings = dict(t)
            return
        manifests, rank_timings = self._collect_ranks(job, refs)
        for objs in refs.values():
            objs.sort(key=lambda o: -1 if o.rank is None else o.rank)
        commit = Commit(
            step=job.step,
            created_at=iso(utc_now()),
            world_size=self.world_size,
            components=refs,
            rank_manifests=manifests,
            timings={},
        )
        t0 = time.monotonic()

        def read_back(ref: ObjectRef) -> None:
            data, sha = st.get(prefix + ref.key, ref.size)
            if len(data) != ref.size or sha != ref.sha256:
                raise CheckpointError(f"read-back of {prefix + ref.key} does not match what was written")

        for _ in self._io.map(read_back, commit.objects()):
            pass
        t["verify_s"] = round(time.monotonic() - t0, 6)
        t0 = time.monotonic()
        listed = {o.key for o in commit.objects()} | {COMMIT}
        strays = [prefix + k for k in list_step(st, job.step) if k not in listed]
        if strays:
            st.delete(strays)  # leftovers of an earlier attempt at this step
        if rank_timings:
            t["ranks"] = rank_timings
        t["restore"] = job.restore
        t["background_s"] = round(time.monotonic() - t_start, 6)  # up to writing COMMIT.json
        commit.timings = t
        body = commit.to_json()
        st.put(prefix + COMMIT, body)
        back, _ = st.get(prefix + COMMIT, len(body))
        if bytes(back) != body:
            raise CheckpointError(f"read-back of {prefix + COMMIT} does not match what was written")
        self.last_committed_step = job.step
        t["commit_s"] = round(time.monotonic() - t0, 6)
        log.info(
            "checkpoint step %d committed to %s (%.1f MB, upload %.2fs, verify %.2fs)",
            job.step,
            self.storage.describe(),
            nbytes / 1e6,
            up,
            t["verify_s"],
        )
        t0 = time.monotonic()
        self._prune(job.step)
        t["prune_s"] = round(time.monotonic() - t0, 6)
        self.last_save_timings = dict(t)

    def _collect_ranks(self, job: _Job, refs: dict[str, list[ObjectRef]]) -> tuple[list[ObjectRef], dict[str, Any]]:
        """Rank 0 waits for every other rank's manifest of this save (the bucket is the rendezvous:
        no collective runs on this background thread)."""
        if self.world_size == 1:
            return [], {}
        st = self.storage
        prefix = step_prefix(job.step)
        pending = set(range(1, self.world_size))
        manifests: list[ObjectRef] = []
        timings: dict[str, Any] = {}
        deadline = time.monotonic() + self.rank_timeout_s
        delay = 0.05
        while pending:
            listing = list_step(st, job.step)
            for r in sorted(pending):
                key = rank_manifest_key(r)
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
                manifests.append(ObjectRef(key, len(data), sha, r))
                timings[str(r)] = raw.get("timings", {})
                pending.discard(r)
            if pending:
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        f"ranks {sorted(pending)} did not upload their part of step {job.step} "
                        f"within {self.rank_timeout_s:.0f}s"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 2.0)
        return manifests, timings

    def _prune(self, new_step: int) -> None:
        """Keep the newest keep_last valid checkpoints (the new, verified one included)."""
        st = self.storage
        try:
            steps = list_steps(st)
            older_valid: list[int] = []
            doomed: list[int] = []
            for s in sorted(steps, reverse=True):
                if s == new_step:
                    continue
                if s > new_step:
                    # Only leftovers seen invalid at restore time: newer dirs may be other ranks'
                    # saves already in progress.
                    if s in self._stale_steps:
                        doomed.append(s)
                    continue
                status = validate_step(st, s, steps[s], deep=False)
                (older_valid if status.valid else doomed).append(s)
            doomed += older_valid[self.keep_last - 1 :]
            for s in doomed:
                objs = steps[s]
                if COMMIT in objs:
                    st.delete([step_prefix(s) + COMMIT])
                st.delete([step_prefix(s) + k for k in objs if k != COMMIT])
                self._stale_steps.discard(s)
        except StorageError as exc:
            # The new checkpoint is committed; pruning is retried after the next one.
            log.warning("pruning old checkpoints failed (will retry next save): %s", exc)

    # -- restore -----------------------------------------------------------------------------

    def latest_valid(self, *, deep: bool = True) -> int | None:
        """The newest step whose checkpoint validates (deep: every sha256 checked), or None. Loads nothing."""
        steps = list_steps(self.storage)
        for s in sorted(steps, reverse=True):
            if validate_step(self.storage, s, steps[s], deep=deep).valid:
                return s
        return None

    def checkpoints(self, *, deep: bool = True) -> list[CheckpointStatus]:
        """Every checkpoint on the target, newest first, with its validation result."""
        return check_checkpoints(self.storage, deep=deep)

    def restore(self, step: int | None = None) -> int | None:
        """Load the newest valid checkpoint (or exactly `step`) into the registered components.

        Corrupt or partial checkpoints are skipped (an incident is recorded for each). Returns the
        restored step, or None when the target holds no valid checkpoint. Nothing is loaded into
        any component unless every component's state has been read, verified and checked to fit.
        """
        self._check_open()
        self.flush()
        if not self._components:
            raise CheckpointError("no components registered: call register() before restore()")
        t_start = time.monotonic()
        steps = list_steps(self.storage)
        candidates = sorted(steps, reverse=True) if step is None else [step]
        if step is not None and step not in steps:
            raise CorruptCheckpointError(f"no checkpoint for step {step} in {self.storage.describe()}")
        wanted = {object_key(c.name, self.rank if c.per_rank else None) for c in self._components.values()}
        skipped: list[CheckpointStatus] = []
        chosen: CheckpointStatus | None = None
        blobs: dict[str, bytearray] = {}
        for s in candidates:
            blobs.clear()
            status = validate_step(
                self.storage, s, steps[s], deep=True, keep=lambda ref: ref.key in wanted, blobs=blobs
            )
            if status.valid:
                chosen = status
                break
            log.warning("checkpoint step %d is not valid: %s", s, "; ".join(p.what for p in status.problems[:3]))
            skipped.append(status)
            if step is not None:
                self._record_incidents(skipped, None)
                raise CorruptCheckpointError(f"checkpoint step {s} is not valid: {status.problems[0].what}")
        self._agree_step(chosen.step if chosen else None)
        self._record_incidents(skipped, chosen.step if chosen else None)
        if chosen is None or chosen.commit is None:
            if skipped:
                log.warning(
                    "no valid checkpoint in %s (%d invalid); starting fresh", self.storage.describe(), len(skipped)
                )
            self._stale_steps = {s.step for s in skipped}
            return None
        t_load = time.monotonic()
        states = self._load_blobs(chosen.commit, blobs)
        for name, state in states.items():
            check_compatible(name, state, self._components[name].obj)
        for name in sorted(states, key=lambda n: _load_priority(self._components[n].obj)):
            self._components[name].obj.load_state_dict(states[name])
        load_s = time.monotonic() - t_load
        timings = {
            "at": iso(utc_now()),
            "from_step": chosen.step,
            "rank": self.rank,
            "download_s": round(chosen.download_s, 6),
            "load_s": round(load_s, 6),
            "total_s": round(time.monotonic() - t_start, 6),
            "bytes": chosen.bytes,
            "skipped_steps": [s.step for s in skipped],
        }
        self.last_restore = RestoreReport(chosen.step, skipped, timings)
        self._pending_restore = timings
        self._restored_step = chosen.step
        self._saves = 0
        self._stale_steps = {s.step for s in skipped if s.step > chosen.step}
        log.info("restored step %d from %s (%.2fs)", chosen.step, self.storage.describe(), timings["total_s"])
        return chosen.step

    def _load_blobs(self, commit: Commit, blobs: dict[str, bytearray]) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for c in self._components.values():
            refs = commit.components.get(c.name)
            if refs is None:
                have = ", ".join(sorted(commit.components))
                raise StateMismatchError(c.name, "", f"not in the checkpoint of step {commit.step} (it has: {have})")
            want_rank = self.rank if c.per_rank else None
            ref = next((r for r in refs if r.rank == want_rank), None)
            if ref is None:
                what = (
                    f"no state for rank {self.rank}: saved with world_size {commit.world_size}, "
                    f"this run has {self.world_size}"
                    if c.per_rank
                    else "saved per rank in the checkpoint but registered as shared here"
                )
                raise StateMismatchError(c.name, f"rank{self.rank}" if c.per_rank else "", what)
            try:
                states[c.name] = torch.load(
                    cast(IO[bytes], BlobReader(blobs.pop(ref.key))),
                    map_location="cpu",
                    weights_only=self.weights_only,
                )
            except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
                hint = "; if it holds custom Python objects, use weights_only=False" if self.weights_only else ""
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise CheckpointError(f"checkpoint component {c.name!r}: cannot load {ref.key}: {first}{hint}") from exc
        return states

    def _agree_step(self, step: int | None) -> None:
        if self.world_size > 1 and _dist_ready():
            seen: list[Any] = [None] * self.world_size
            dist.all_gather_object(seen, step)
            if len(set(seen)) != 1:
                raise CheckpointError(f"ranks found different latest valid checkpoints: {seen}; not restoring")

    def _record_incidents(self, skipped: Iterable[CheckpointStatus], fell_back_to: int | None) -> None:
        if self.rank != 0:
            return
        for status in skipped:
            try:
                key = record_incident(self.storage, status, fell_back_to, self.rank, self.storage.describe())
                log.warning("incident recorded: %s", key)
            except StorageError as exc:
                log.error("could not record incident for step %d: %s", status.step, exc)

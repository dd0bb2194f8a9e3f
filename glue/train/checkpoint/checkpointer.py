"""The Checkpointer: named state components, asynchronous full-state saves, validated restores.

The user-facing half. The training thread copies state to host memory and returns; one background
thread runs the commit protocol (glue.train.checkpoint.commit: upload, verify, COMMIT.json last,
prune). At most one save is in flight: the next save() waits for it (back-pressure, bounded memory)
and raises if it failed. A pending save is flushed on SIGTERM and at exit (glue.train.checkpoint.exit_hooks).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch.distributed as dist
from boto3.s3.transfer import TransferConfig

from glue.train.checkpoint import assemble, exit_hooks, invalid
from glue.train.checkpoint.commit import IO_DEPTH, Piece, SaveJob, prune, refuse_rewind, write_step
from glue.train.checkpoint.components import Component, RestoreReport, Stateful, is_sharded
from glue.train.checkpoint.format import CheckpointStatus, Commit, check_checkpoints, list_steps, validate_step
from glue.train.checkpoint.load import StepFetch, load_priority
from glue.train.checkpoint.snapshot import HostSnapshotter, check_compatible
from glue.train.errors import CheckpointError, CorruptCheckpointError, SaveFailedError
from glue.train.storage import mount_config
from glue.train.storage.retry import RetryPolicy
from glue.train.storage.s3_client import CredentialsCallback
from glue.train.storage.target import Storage, open_target
from glue.train.utc import iso, utc_now

log = logging.getLogger("glue.train")


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _open_storage(target: str | os.PathLike[str], *, endpoint_url: str | None, credentials: CredentialsCallback | None,
                  region: str | None, transfer: TransferConfig | None, retry: RetryPolicy | None) -> Storage:
    if endpoint_url is None and credentials is None:
        # Under the VM's bucket mount: commit, verify and prune in the bucket itself (mount_config).
        target, endpoint_url, credentials, region = mount_config.resolve(os.fspath(target), region)
    return open_target(target, endpoint_url=endpoint_url, credentials=credentials, region=region,
                       transfer=transfer, retry=retry)


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
        self.storage: Storage = storage or _open_storage(
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
        self._init_runtime()
        for name, obj in (components or {}).items():
            self.register(name, obj)
        self._sigterm: exit_hooks.SigtermFlush | None = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            self._sigterm = exit_hooks.SigtermFlush(self._flush_quietly)
        exit_hooks.flush_at_exit(self)

    def _init_runtime(self) -> None:
        """What the Checkpointer keeps between calls: its components, threads, and the save/restore state."""
        self._components: dict[str, Component] = {}
        self._snap = HostSnapshotter()
        self._plans: Any = None  # sharded_save.Plans, once a sharded component is saved
        self._session: str | None = None  # this Checkpointer's save id, agreed by all ranks
        self._nonces = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpukit-ckpt")
        self._io = ThreadPoolExecutor(max_workers=IO_DEPTH, thread_name_prefix="gpukit-ckpt-io")
        # restore() deserializes each verified object here while the others still download.
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpukit-ckpt-load")
        self._inflight: tuple[int, Future[None]] | None = None
        self._closed = False
        self._saves = 0
        self._restored_step: int | None = None
        self._stale_steps: set[int] = set()
        self._pending_restore: dict[str, Any] | None = None
        self.last_committed_step: int | None = None
        self.last_save_timings: dict[str, Any] = {}
        self.last_restore: RestoreReport | None = None

    # -- components --------------------------------------------------------------------------

    def register(self, name: str, obj: Any, *, per_rank: bool | None = None) -> Any:
        """Add a component (anything with state_dict()/load_state_dict()); returns obj.

        per_rank defaults to True for RNGState, ResumableSampler and StatefulDataLoader: every rank
        saves and restores its own. Everything else is shared and saved by rank 0 only.
        """
        component = Component.of(name, obj, per_rank)
        if name in self._components:
            raise CheckpointError(f"component {name!r} is already registered")
        self._components[name] = component
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
        refuse_rewind(self.storage, step, self._restored_step)
        nonce = self._agree_nonce()
        t1 = time.monotonic()
        pieces, sharded = self._snapshot()
        snapshot_s = time.monotonic() - t1
        job = SaveJob(step=step, nonce=nonce, pieces=pieces,
                      timings={"wait_s": round(wait_s, 6), "snapshot_s": round(snapshot_s, 6)},
                      restore=self._pending_restore, sharded=sharded)
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

    def _snapshot(self) -> tuple[list[Piece], list[str]]:
        """Host copies of this rank's objects of a save, and the names of the sharded components.
        A sharded component is staged through DCP by every rank (its own shards); shared state by rank 0 only."""
        pieces: list[Piece] = []
        sharded: list[str] = []
        plain: dict[str, Any] = {}
        for c in self._components.values():
            if c.sharded is False and not c.per_rank and self.rank != 0:
                continue
            state = c.obj.state_dict()
            if c.sharded is None:
                c.sharded = is_sharded(state)  # the same on every rank: it is the model's layout
            if c.sharded:
                from glue.train.checkpoint import sharded_save  # DCP: imported only by sharded runs

                self._plans = self._plans or sharded_save.Plans()
                staged = self._plans.stage(c.name, state, self.rank, self._snap)
                pieces.append(Piece(c.name, self.rank, staged.as_state()))
                sharded.append(c.name)
            elif c.per_rank or self.rank == 0:
                plain[c.name] = state
        for name, copied in self._snap.copy(plain).items():
            pieces.append(Piece(name, self.rank if self._components[name].per_rank else None, copied))
        return pieces, sharded

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
            self._loader.shutdown(wait=True)
            if self._sigterm is not None:
                self._sigterm.remove()
            exit_hooks.forget(self)

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

    def _agree_nonce(self) -> str:
        # Ranks must recognise each other's parts of *this* save, not leftovers of an earlier
        # attempt at the same step: rank 0 picks an id once (a tiny collective; once per save it
        # cost a tenth of the training thread's stall) and every save after it is numbered, which
        # all ranks count alike since every rank calls save() for every step.
        if self._session is None:
            token = secrets.token_hex(8)
            if self.world_size > 1 and _dist_ready():
                box: list[Any] = [token]
                dist.broadcast_object_list(box, src=0)
                token = str(box[0])
            elif self.world_size > 1:
                token = "unsynchronised"
            self._session = token
        self._nonces += 1
        return self._session if self._session == "unsynchronised" else f"{self._session}.{self._nonces}"

    # -- the background half of a save --------------------------------------------------------

    def _run(self, job: SaveJob) -> None:
        write_step(self.storage, job, rank=self.rank, world_size=self.world_size, io_pool=self._io,
                   rank_timeout_s=self.rank_timeout_s)
        self.last_committed_step = job.step
        if self.rank == 0:
            t0 = time.monotonic()
            # Never the step this process resumed from: should the resume prove wrong, it is the one to go back to.
            prune(self.storage, job.step, keep_last=self.keep_last, stale_steps=self._stale_steps,
                  keep={s for s in (self._restored_step,) if s is not None})
            job.timings["prune_s"] = round(time.monotonic() - t0, 6)
        self.last_save_timings = dict(job.timings)

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

    def restore(self, step: int | None = None, *, start_fresh: bool = False) -> int | None:
        """Load the newest valid checkpoint (or exactly `step`) into the registered components.

        Interrupted saves and corrupt checkpoints are skipped (an incident is recorded for each;
        corrupt ones are moved aside to ckpt-invalid/). Returns the restored step, or None when the
        target holds no checkpoint. When committed checkpoints exist but none is valid it raises
        NoValidCheckpointError and changes nothing, unless start_fresh=True (rejected ones do not count:
        with only those and interrupted saves left, the run starts fresh). Nothing is loaded into
        any component unless every component's state has been read, verified and checked to fit.
        """
        self._check_open()
        self.flush()
        if not self._components:
            raise CheckpointError("no components registered: call register() before restore()")
        t_start = time.monotonic()
        steps = list_steps(self.storage)
        if step is not None and step not in steps:
            raise CorruptCheckpointError(f"no checkpoint for step {step} in {self.storage.describe()}")
        fetched, skipped = self._fetch_newest_valid(steps, step)
        chosen = fetched.status.step if fetched is not None else None
        self._agree_step(chosen)
        self._record_skipped(steps, skipped, chosen, start_fresh)
        if fetched is None or fetched.status.commit is None:
            if skipped:
                log.warning("no valid checkpoint in %s (%d invalid); starting fresh", self.storage.describe(),
                            len(skipped))
            self._stale_steps = {s.step for s in skipped}
            return None
        return self._load(fetched, fetched.status.commit, skipped, t_start)

    def _fetch_newest_valid(self, steps: dict[int, dict[str, int]],
                            step: int | None) -> tuple[StepFetch | None, list[CheckpointStatus]]:
        """The newest step (or exactly `step`) that validates and downloads whole, and the ones skipped on the way."""
        skipped: list[CheckpointStatus] = []
        for s in sorted(steps, reverse=True) if step is None else [step]:
            status = validate_step(self.storage, s, steps[s], deep=False)
            if status.valid:
                assert status.commit is not None
                wanted = assemble.wanted(self._components, status.commit, self.rank, self.world_size)
                fetch = StepFetch(self.storage, status, wanted, self._loader, weights_only=self.weights_only)
                if fetch.run().valid:
                    return fetch, skipped
            log.warning("checkpoint step %d is not valid: %s", s, "; ".join(p.what for p in status.problems[:3]))
            skipped.append(status)
            if step is not None:
                invalid.record_skipped(self.storage, skipped, steps, None, self.rank, move=False)
                raise CorruptCheckpointError(f"checkpoint step {s} is not valid: {status.problems[0].what}")
        return None, skipped

    def _record_skipped(self, steps: dict[int, dict[str, int]], skipped: list[CheckpointStatus],
                        chosen: int | None, start_fresh: bool) -> None:
        # Interrupted saves and rejected checkpoints (a wrong resume's) are no run state to miss: with only
        # those left the run starts fresh; a committed checkpoint gone bad stops it.
        if chosen is None and not start_fresh and any(invalid.corrupt(steps[s.step]) for s in skipped):
            invalid.record_skipped(self.storage, skipped, steps, None, self.rank, move=False)
            raise invalid.no_valid_error(self.storage.describe(), skipped)
        invalid.record_skipped(self.storage, skipped, steps, chosen, self.rank, move=True)

    def _load(self, fetched: StepFetch, commit: Commit, skipped: list[CheckpointStatus], t_start: float) -> int:
        """Every fetched state checked to fit before any is loaded; then the restore's record."""
        chosen = fetched.status
        t_load = time.monotonic()
        states = assemble.states(self._components, commit, fetched.states, self.rank, self.world_size)
        for name, state in states.items():
            check_compatible(name, state, self._components[name].obj)
        for name in sorted(states, key=lambda n: load_priority(self._components[n].obj)):
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

    def _agree_step(self, step: int | None) -> None:
        if self.world_size > 1 and _dist_ready():
            seen: list[Any] = [None] * self.world_size
            dist.all_gather_object(seen, step)
            if len(set(seen)) != 1:
                raise CheckpointError(f"ranks found different latest valid checkpoints: {seen}; not restoring")

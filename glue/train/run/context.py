"""The trainer's side of a deployed run: config, heartbeat, metrics, error file, outputs.

`glue deploy` starts the trainer with GPUKIT_* variables (never secrets on the command line);
`RunContext.from_env()` turns them into:
- `ctx.config`: the run's resolved config values;
- `ctx.checkpointer(...)`: a Checkpointer on the run's checkpoint target (a path under the bucket
  mount is reached through the S3 API: glue.train.storage.mount) that never commits once a newer attempt of
  the run exists (glue.train.checkpoint.fence);
- `ctx.step(step, loss)`: per-step metrics (parts under runs/<run>/metrics/), a heartbeat and, once,
  the loaded library modules (glue.train.run.warm_imports) written by a background thread;
- `with ctx:` records a crash's exception into runs/<run>/attempts/<n>.error.rank<r>[.x<gen>].json;
- under torchrun (WORLD_SIZE > 1) it joins the default process group itself (gloo, plus nccl for
  CUDA tensors) and resumes whenever the group is in a restart round (`ctx.restart` > 0);
- `ctx.write_output(name, data)`: an exported result under the run's output destination;
- a termination notice (SIGTERM, or the backend's notice file: glue.train.run.notice) makes the next
  `ctx.step()` save a checkpoint at that step, record the notice and exit with PREEMPTED_EXIT.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from glue.train.checkpoint.checkpointer import Checkpointer
from glue.train.checkpoint.fence import FencedStorage
from glue.train.checkpoint.sealed import FolderCheckpoints
from glue.train.errors import StorageError
from glue.train.layout import carried_metrics_key, error_key, heartbeat_key, metrics_key, notice_key, run_uri
from glue.train.run import process_group as group
from glue.train.run import warm_imports
from glue.train.run.launch import MissingTrainerEnv, TrainerEnv
from glue.train.run.notice import PREEMPTED_EXIT, TerminationNotice
from glue.train.run.probe import Probe
from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.mount import bucket_url, mount_path
from glue.train.storage.target import Storage, open_target
from glue.train.utc import UTC, iso, utc_now

log = logging.getLogger("glue.train")

def _memory() -> dict[str, float]:
    mem: dict[str, float] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                mem["rss_mb" if line.startswith("VmRSS") else "peak_rss_mb"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    import torch

    if torch.cuda.is_available():
        mem["cuda_allocated_mb"] = torch.cuda.memory_allocated() / 2**20
        mem["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return mem


METRICS_FLUSH_SECONDS = 5.0


class _MetricsFirstCheckpointer(Checkpointer):
    """Every step up to a checkpoint reaches the metrics log before that checkpoint can commit, so a
    resume from it replays every later step and no step's loss is lost with the VM (without this,
    steps between the last heartbeat and a checkpoint taken just before the VM died had no record)."""

    def __init__(self, ctx: RunContext, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._ctx = ctx

    def register(self, name: str, obj: Any, *, per_rank: bool | None = None) -> Any:
        if self._ctx.probe is not None:  # a memprobe trial measures what the trainer registers
            self._ctx.probe.watch(obj)
        return super().register(name, obj, per_rank=per_rank)

    def save(self, step: int, *, blocking: bool = False) -> None:
        if self._ctx.probe is not None:
            return  # a memprobe trial keeps nothing (and a save's host copy would blur its memory)
        self._ctx._flush_metrics()  # one small PUT per checkpoint, on the training thread
        super().save(step, blocking=blocking)


class RunContext:
    def __init__(self, env: dict[str, str]) -> None:
        spec = TrainerEnv.from_env(env)
        self.run = spec.run
        self.attempt = spec.attempt
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.node = spec.node or 0
        self.vm = spec.vm or socket.gethostname()
        self.restart = 0
        self.config: dict[str, Any] = spec.config
        self.checkpoint_target = spec.checkpoint
        self.checkpoint_interval = spec.checkpoint_interval
        self.keep_last = spec.keep_last
        self.outputs_target = spec.outputs
        self.heartbeat_seconds = spec.heartbeat_seconds
        self.scratch = Path(spec.scratch)
        self.endpoint = spec.bucket_endpoint
        self.region = spec.bucket_region
        cred_file = spec.credentials_file
        self._creds = (lambda: credentials_from_file(cred_file)) if cred_file else None
        bucket = spec.bucket_name
        self.bucket, self.mount = bucket, spec.mount
        self.via_mount = spec.via_mount  # a serverless run: the bucket only at the mount
        # A memprobe trial (glue.train.run.probe): its records stay in the probe folder, never the run's.
        self.probe = Probe.from_env(env)
        self.store: Storage = self._open(run_uri(bucket, self.run) if self.probe is None
                                         else str(self.probe.folder / "records"))
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last: dict[str, Any] = {}
        if group.under_torchrun(env):
            # torchrun restarts every worker of the group after a failure. Join the process group first to
            # learn the group-wide restart generation: in a restart round every rank resumes.
            self.restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))  # until the group says otherwise
            try:
                self.restart = group.join(env)
            except (RuntimeError, ValueError) as exc:  # rendezvous / connect failures (DistError is one)
                self._record_error(type(exc), exc, exc.__traceback__)
                raise
        self.resume = spec.resume or self.restart > 0
        # `glue drill` asks the attempt it will destroy to stop dead after one exact step ("<attempt>:<step>"):
        # the VM dies at that step, not wherever the next heartbeat happened to land.
        hold_attempt, _, hold_step = (spec.hold_at or "").partition(":")
        self._hold_at = int(hold_step) if hold_attempt == str(self.attempt) and hold_step.isdigit() \
            and self.restart == 0 else None
        self._held, self._imports_due = False, self.rank == 0 and self.probe is None  # imports: warm spares'
        self._metrics: list[str] = []
        self._part = 0
        self._last_flush = time.monotonic()
        self._started_at = iso(utc_now())
        self._stop = threading.Event()
        self._ckpt: Checkpointer | None = None
        self._notice = TerminationNotice(sigterm=not group.under_torchrun(env))
        self._keep_previous_steps()
        self._thread = threading.Thread(target=self._beat_loop, name="gpukit-heartbeat", daemon=True)
        self._thread.start()

    def _keep_previous_steps(self) -> None:
        """The last heartbeat of an earlier attempt (or torchrun restart) carries the steps it had not yet
        put into a metrics part; save them as its final part before our first heartbeat replaces it."""
        try:
            data, _ = self.store.get(heartbeat_key(self.rank))
        except StorageError:
            return
        beat = json.loads(bytes(data))
        prev, prev_restart = beat.get("attempt"), int(beat.get("restart") or 0)
        if isinstance(prev, int) and (prev, prev_restart) < (self.attempt, self.restart) and beat.get("recent"):
            lines = "".join(json.dumps(r) + "\n" for r in beat["recent"])
            self.store.put(carried_metrics_key(prev, self.rank, prev_restart), lines.encode())

    @classmethod
    def from_env(cls) -> RunContext:
        """The attempt's context from the environment `glue deploy` gives; outside one, a one-line exit
        (the user's script ran by hand), not a KeyError's traceback."""
        try:
            return cls(dict(os.environ))
        except MissingTrainerEnv as exc:
            raise SystemExit(f"gpukit: {exc}") from None

    def _direct(self, target: str) -> str:
        """Under the bucket mount: the same keys through the S3 API (glue.train.storage.mount says why); with
        no S3 API here (GPUKIT_BUCKET_VIA=mount), the other way round."""
        if self.via_mount:
            return mount_path(target, self.bucket, self.mount)
        url = bucket_url(target, self.bucket, self.mount)
        if url is None:
            return target
        log.info("%s is under the bucket mount: written through the S3 API as %s", target, url)
        return url

    def _s3_kw(self, target: str, **kw: Any) -> dict[str, Any]:
        """`kw` with the bucket's endpoint, credentials and region when `target` is in S3."""
        if target.startswith("s3://"):
            kw.update(endpoint_url=self.endpoint, credentials=self._creds, region=self.region)
        return kw

    def _open(self, target: str) -> Storage:
        target = self._direct(target)
        return open_target(target, **self._s3_kw(target, check=False))

    def checkpointer(self, **kwargs: Any) -> Checkpointer:
        target = self._direct(self.checkpoint_target)
        kw = {**self._s3_kw(target, keep_last=self.keep_last), **kwargs}
        ck = _MetricsFirstCheckpointer(self, target, **kw)
        ck.storage = FencedStorage(ck.storage, self.store, self.run, self.attempt)  # glue.train.checkpoint.fence
        self._ckpt = ck
        self._notice.install()  # on top of the checkpointer's SIGTERM flush: the notice saves at the step
        return ck

    def folder_checkpoints(self, **kwargs: Any) -> FolderCheckpoints:
        """Sealed framework checkpoints (glue.train.integrations) on the run's checkpoint target, fenced
        like the checkpointer: a replaced attempt never commits."""
        target = self._direct(self.checkpoint_target)
        kw = {**self._s3_kw(target, keep_last=self.keep_last), **kwargs}
        sealed = FolderCheckpoints(target, **kw)
        sealed.storage = FencedStorage(sealed.storage, self.store, self.run, self.attempt)
        self._notice.install()
        return sealed

    def probe_watch(self, *objs: Any) -> None:
        """A framework integration's model and optimizer, measured in a memprobe trial (no-op otherwise)."""
        if self.probe is not None:
            self.probe.watch(*(o for o in objs if o is not None))

    def probe_stop_due(self, steps_done: int | None = None) -> bool:
        """A memprobe trial has run its steps: the integration stops training (False outside a probe)."""
        return self.probe is not None and self.probe.stop_due(steps_done)

    def notice_pending(self) -> bool:
        """A termination notice is pending (agreed by every rank): the trainer should save now and stop."""
        return self._notice_agreed()

    def exit_after_notice(self, step: int, saved: bool) -> None:
        """After the trainer saved (or could not) on a notice: record it, publish this step, exit PREEMPTED_EXIT."""
        self._flush_metrics()  # the steps up to the save are in the bucket before we go
        self._finish_notice(self._notice_record(step), step if saved else None)

    # -- per step ------------------------------------------------------------------------------
    def step(self, step: int, loss: float, **extra: Any) -> None:
        """Record one completed step (cheap: no I/O on the training thread). A pending termination notice
        is acted on here: checkpoint at this step, exit PREEMPTED_EXIT. Under torchrun every rank calls
        this at every step (each records its own metrics), so the ranks agree on the notice here."""
        self.record_step(step, loss, **extra)
        if self.probe is not None and self.probe.stop_due():
            raise SystemExit(0)  # the memprobe trial ran its steps (recorded by record_step)
        if self._notice_agreed():
            self._stop_on_notice(step)

    def record_step(self, step: int, loss: float, **extra: Any) -> None:
        """step() without acting on a notice: for a framework integration that saves through the framework
        (it asks notice_pending() itself, then exit_after_notice())."""
        now = utc_now()
        rec = {"step": step, "loss": loss, "t": iso(now), "attempt": self.attempt, "rank": self.rank,
               "restart": self.restart, **extra}
        with self._lock:
            self._last = rec
            self._metrics.append(json.dumps(rec))
        if self.probe is not None and not self.probe.stop_due():
            self.probe.on_step(loss)
        if step == self._hold_at:
            self._hold()

    def _notice_agreed(self) -> bool:
        """The notice, agreed by every rank (one rank's notice stops all at the same step: a checkpoint
        needs every rank's part)."""
        pending = self._notice.pending
        if self.world_size > 1:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                flag = torch.tensor([1 if pending else 0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                return bool(flag.item())
        return pending

    def _notice_record(self, step: int) -> dict[str, Any]:
        seen = self._notice.seen_at
        rec: dict[str, Any] = {
            "run": self.run, "attempt": self.attempt, "rank": self.rank, "restart": self.restart, "vm": self.vm,
            "source": self._notice.source or "another rank's notice",
            "seen_at": iso(utc_now()) if seen is None else iso(datetime.fromtimestamp(seen, UTC)),
            "step": step, "saved_step": None, "saved_at": None,
        }
        self._put_notice(rec)  # first: evidence even when the VM goes before the save commits
        return rec

    def _stop_on_notice(self, step: int) -> None:
        """Save at this step (blocking: committed before we go), record the notice, exit PREEMPTED_EXIT."""
        rec = self._notice_record(step)
        if self._ckpt is not None:
            self._ckpt.save(step, blocking=True)
        self._finish_notice(rec, step if self._ckpt is not None else None)

    def _finish_notice(self, rec: dict[str, Any], saved_step: int | None) -> None:
        if saved_step is not None:
            rec.update(saved_step=saved_step, saved_at=iso(utc_now()))
            self._put_notice(rec)
        self._flush_metrics()
        self._write_heartbeat()
        log.warning("termination notice (%s): checkpoint at step %s, exiting %d", rec["source"], saved_step,
                    PREEMPTED_EXIT)
        raise SystemExit(PREEMPTED_EXIT)

    def _put_notice(self, rec: dict[str, Any]) -> None:
        try:
            self.store.put(notice_key(self.attempt, self.rank), json.dumps(rec).encode())
        except StorageError:
            pass  # the exit code still says what happened

    def _hold(self) -> None:
        """Publish this step (metrics and a heartbeat saying `held`), then wait to be killed: training never
        continues past the step the drill asked for."""
        self._held = True
        self._flush_metrics()
        self._write_heartbeat()
        threading.Event().wait()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            self._write_heartbeat()
            if self._imports_due and self._last:  # after the first step: what it imported is loaded
                self._imports_due = not warm_imports.write(self.store)
            # Metrics parts every few seconds: a lost VM takes at most that much of the log with it,
            # while the training thread pays for one PUT per part, not one per heartbeat.
            if time.monotonic() - self._last_flush >= METRICS_FLUSH_SECONDS:
                self._flush_metrics()

    def _write_heartbeat(self) -> None:
        with self._lock:
            last = dict(self._last)
            # Steps not yet in a metrics part ride along: one PUT a beat, nothing lost but the last beat.
            recent = [json.loads(line) for line in self._metrics[-500:]]
        beat = {
            "run": self.run, "attempt": self.attempt, "rank": self.rank, "restart": self.restart,
            "node": self.node, "vm": self.vm, "world_size": self.world_size, "host": socket.gethostname(),
            "pid": os.getpid(), "step": last.get("step"), "loss": last.get("loss"),
            "step_at": last.get("t"), "started_at": self._started_at, "updated_at": iso(utc_now()),
            "memory": _memory(),
            "recent": recent,
            "held": self._held,
            "closed": self._stop.is_set(),  # close()'s last beat: the trainer ends, its exit record follows
        }
        try:
            self.store.put(heartbeat_key(self.rank), json.dumps(beat).encode())
        except StorageError:
            pass  # a missed heartbeat is itself the signal; the next one retries

    def _flush_metrics(self) -> None:
        """Put the steps recorded so far into a new metrics part (from the heartbeat thread, and from the
        training thread before each checkpoint save). One flush at a time: parts land in step order, so a
        reader never sees a later part while an earlier one is still in flight."""
        with self._flush_lock:
            with self._lock:
                lines, self._metrics = self._metrics, []
                self._last_flush = time.monotonic()
                if not lines:
                    return
                self._part += 1
                key = metrics_key(self.attempt, self.rank, self.restart, self._part)
            try:
                self.store.put(key, ("\n".join(lines) + "\n").encode())
            except StorageError:
                with self._lock:  # keep them for the next flush rather than lose them
                    self._metrics = lines + self._metrics

    # -- outputs and lifecycle ------------------------------------------------------------------
    def write_output(self, name: str, data: bytes) -> None:
        self._open(self.outputs_target).put(name, data)

    def close(self) -> None:
        if self.probe is not None:
            self.probe.finish()
        self._notice.close()
        self._stop.set()
        self._thread.join(timeout=5)
        self._write_heartbeat()
        self._flush_metrics()

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt | SystemExit):
            if self.probe is not None:
                self.probe.fail(exc)
            self._record_error(typ, exc, tb)
        self.close()

    def _record_error(self, typ: type[BaseException] | None, exc: BaseException, tb: TracebackType | None) -> None:
        """The error file of this rank and restart generation: what `glue incidents` orders across ranks."""
        with self._lock:
            last = dict(self._last)
        err = {
            "type": f"{typ.__module__}.{typ.__qualname__}" if typ else "",
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(typ, exc, tb)),
            "last_step": last.get("step"),
            "rank": self.rank,
            "restart": self.restart,
            "node": self.node,
            "vm": self.vm,
            "at": iso(utc_now()),
            "memory": _memory(),
        }
        try:
            self.store.put(error_key(self.attempt, self.rank, self.restart), json.dumps(err).encode())
        except StorageError:
            pass

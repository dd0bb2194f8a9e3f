"""One `glue memprobe` investigation as named steps: resolve what is probed and under which limit
(`prepare`), run the trials, save the report where it belongs (`Session.run`). The click command only
turns options into a `Request` and prints what comes back."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.memprobe import investigate, remedies, source
from glue.memprobe import output as report_out
from glue.memprobe.limits import safety_limit_mb, total_mb
from glue.memprobe.runner import TrialOutcome
from glue.runs import memprobe_hint
from glue.runs.store import RunStore, utc_iso

# A trial is a fresh process that imports torch and builds the model before its first step (seconds on
# its own): a shorter limit would only time every trial out.
MIN_TRIAL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Request:
    """What the command line asks for (validated by click as far as one option goes)."""

    config_path: Path | None = None
    run_id: str | None = None
    vary: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ()
    grid: str = "int"
    device: str | None = None
    memory_limit_mb: int | None = None
    limit_mechanism: str = "auto"
    sets: tuple[str, ...] = ()
    trial_steps: int = 2
    accept_steps: int = 20
    tolerance: float = 0.05
    accum: int = 4
    remedy_names: tuple[str, ...] = ()
    no_remedies: bool = False
    no_breakdown: bool = False
    remedies_at: int | None = None
    trial_timeout: float = 600.0
    out_path: Path | None = None
    vm: str | None = None  # a run's own job: the VM its trials run on
    command: str | None = None  # as typed, for the report


@dataclass
class Result:
    report: dict[str, Any]
    saved: list[str] = field(default_factory=list)  # where the report went
    unsaved: str | None = None  # why it is not where it was asked to go (it went elsewhere)


def unique(items: tuple[str, ...]) -> list[str]:
    """Repeated --vary/--remedy values once each, in the order first given."""
    return list(dict.fromkeys(items))


def _is_report(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("kind") == "gpukit.memprobe"
    except (OSError, ValueError, AttributeError):
        return False


def check_out(path: Path) -> None:
    """Before any trial: the report can be written to `path`, and writing it loses nothing (an existing
    file is overwritten only when it is an earlier memprobe report)."""
    if path.exists():
        if not path.is_file() or not _is_report(path):
            raise GlueError(f"--out {path} exists and is not a memprobe report: choose another path "
                            "(memprobe overwrites only its own reports)")
        if not os.access(path, os.W_OK):
            raise GlueError(f"--out {path} is not writable; choose another path")
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise GlueError(f"--out {path}: {parent} is not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GlueError(f"--out {path}: cannot create files in {parent}; choose another path")


def _device(req: Request, src: source.Source, cfg: dict[str, Any]) -> str:
    """--device, else cuda for a run that failed out of GPU memory, else the config's device."""
    device = req.device
    if device is None:
        device = "cuda" if str(src.failure.get("failure_class")) == "oom_gpu" else str(cfg.get("device") or "cpu")
    return "cuda" if device.startswith("cuda") else "cpu"


def _limit(req: Request, src: source.Source, device: str) -> tuple[int | None, str]:
    """The memory limit per trial and where it comes from (said in the report)."""
    if req.memory_limit_mb is not None:
        total = total_mb() if device == "cpu" else None
        if total is not None and req.memory_limit_mb > total:
            raise GlueError(f"--memory-limit-mb {req.memory_limit_mb} is more than this machine's memory ({total} MB): "
                            f"it would limit nothing; give at most {total}, or leave it out")
        return req.memory_limit_mb, "--memory-limit-mb"
    if src.memory_limit_mb:
        return src.memory_limit_mb, f"the limit of run {src.run}'s attempt {src.failure.get('attempt')}"
    if device == "cpu":
        return safety_limit_mb(), "90% of this machine's available memory"
    return None, "the GPU's own capacity"


@dataclass
class Session:
    """A resolved investigation: ready to run, nothing probed yet."""

    req: Request
    src: source.Source
    store: RunStore | None  # the run's store (--run): the report is saved with the run
    cfg: dict[str, Any]
    opts: investigate.Options
    stamp: str
    local_out: Path | None  # the report file on this machine, when there is one

    @property
    def summary(self) -> str:
        o = self.opts
        limit = f"{o.memory_limit_mb} MB" if o.memory_limit_mb else "none"
        where = f"{o.job.host.name} ({o.device}): {' '.join(o.job.rc.command)}" if o.job is not None else o.device
        return f"{self.src.description} on {where}; limit: {limit} ({o.limit_source}); varying {', '.join(o.vary)}"

    def run(self) -> Result:
        report = self._header()
        self._save_partials_to_local_out(report)
        report.update(investigate.run(self.cfg, self.opts))
        result = Result(report)
        self._save_to_run(result)
        self._save_to_local_out(result)
        return result

    def _header(self) -> dict[str, Any]:
        import torch  # seconds to import: only once the input is known to be good

        o = self.opts
        return {
            "kind": "gpukit.memprobe", "version": investigate.REPORT_VERSION, "created_at": utc_iso(),
            "command": self.req.command,
            "source": {"run": self.src.run, "config": self.src.config_path, "failure": self.src.failure or None,
                       "job": {"vm": o.job.host.name, "command": list(o.job.rc.command)} if o.job else None},
            "device": o.device, "memory_limit_mb": o.memory_limit_mb, "limit_source": o.limit_source,
            "torch": torch.__version__, "config": self.cfg,
            "options": {"vary": o.vary, "ranges": o.ranges, "grid": o.grid, "trial_steps": o.trial_steps,
                        "accept_steps": o.accept_steps, "tolerance": o.tolerance, "accum": o.accum,
                        "remedies": list(o.remedies), "mechanism": o.mechanism},
        }

    def _save_partials_to_local_out(self, header: dict[str, Any]) -> None:
        target = self.local_out
        if target is None:
            return

        def save_partial(partial: dict[str, Any]) -> None:  # what is known so far survives an interrupted probe
            try:
                report_out.save_local({**header, **partial}, target)
            except OSError:
                pass  # the final save says so, and keeps the report elsewhere

        self.opts.on_stage = save_partial

    def _save_to_run(self, result: Result) -> None:
        if self.store is None:
            return
        snapshot = self.opts.snapshot_path
        if snapshot is not None and snapshot.exists():
            key = self.store.put_memprobe_snapshot(self.stamp, snapshot.read_bytes())
            result.report["breakdown"]["cuda_snapshot_file"] = key
        key = self.store.put_memprobe(self.stamp, result.report)
        result.saved.append(f"{key} (bucket {self.store.info.name})")

    def _save_to_local_out(self, result: Result) -> None:
        if self.local_out is None:
            return
        try:
            result.saved.append(str(report_out.save_local(result.report, self.local_out)))
        except OSError as exc:  # the probe's work is not lost: it goes to the temp directory instead
            fallback = report_out.save_local(result.report,
                                              Path(tempfile.gettempdir()) / f"memprobe-{self.stamp}.json")
            result.saved.append(str(fallback))
            result.unsaved = (f"cannot write {self.local_out} ({exc.strerror}); "
                              f"the report was saved to {fallback} instead")


def prepare(home: Path, req: Request, progress: Callable[[str, TrialOutcome | None], None]) -> Session:
    """Every check of the input, before any trial: one GlueError line for the first problem."""
    if (req.config_path is None) == (req.run_id is None):
        raise GlueError("give exactly one of --config run.yaml or --run RUN")
    if req.no_remedies and (req.remedy_names or req.remedies_at is not None):
        given = "--remedy" if req.remedy_names else "--remedies-at"
        raise GlueError(f"{given} and --no-remedies contradict each other: drop one")
    store: RunStore | None = None
    if req.run_id is not None:
        src, store = source.from_run(home, req.run_id)
    else:
        assert req.config_path is not None
        src = source.from_config_file(req.config_path)
    if src.job:
        return _prepare_job(home, req, src, store, progress)
    cfg = source.trainer_config(src.trainer_cfg, source.parse_set(req.sets), where=src.description)
    device = _device(req, src, cfg)
    cfg["device"] = device
    limit, limit_source = _limit(req, src, device)
    varied = unique(req.vary) or ["batch_size"]
    for var in varied:
        if var not in investigate.VARIABLES:
            raise GlueError(f"cannot vary {var!r} of {source.TRAINER_MODULE}; choose from "
                            f"{', '.join(investigate.VARIABLES)}")
    unknown = [r for r in req.remedy_names if r not in remedies.NAMES]
    if unknown:
        raise GlueError(f"--remedy {unknown[0]}: not a remedy memprobe knows for {source.TRAINER_MODULE}; "
                        f"choose from {', '.join(remedies.NAMES)}")
    stamp = report_out.utc_stamp()
    default_out = Path(f"memprobe-{stamp}.json")
    local_out = req.out_path or (default_out if store is None else None)
    if local_out is not None:
        check_out(local_out)
    snapshot = None
    if device == "cuda" and not req.no_breakdown:  # a CUDA memory snapshot of the profiled step goes with the report
        snapshot = (Path(tempfile.gettempdir()) / f"memprobe-{stamp}.snapshot.pickle" if store is not None
                    else (req.out_path or default_out).with_suffix(".snapshot.pickle"))
    opts = investigate.Options(
        vary=varied, ranges=source.parse_ranges(req.ranges, varied), grid=req.grid, device=device,
        memory_limit_mb=limit, limit_source=limit_source, mechanism=req.limit_mechanism,
        trial_steps=req.trial_steps, accept_steps=req.accept_steps, tolerance=req.tolerance, accum=req.accum,
        remedies=() if req.no_remedies else (tuple(unique(req.remedy_names)) or remedies.NAMES),
        breakdown=not req.no_breakdown, remedies_at=req.remedies_at, trial_timeout_s=req.trial_timeout,
        snapshot_path=snapshot, progress=progress,
    )
    return Session(req, src, store, cfg, opts, stamp, local_out)


def _prepare_job(home: Path, req: Request, src: source.Source, store: RunStore | None,
                 progress: Callable[[str, TrialOutcome | None], None]) -> Session:
    """A run's own job: its config and declared remedies checked, its workspace prepared on a VM."""
    from glue.memprobe import job

    assert src.manifest is not None
    trials_store = store if store is not None else RunStore.open(home, job.CONFIG_RUN)
    rc = job.run_config(src.run or job.CONFIG_RUN, src.manifest, trials_store.info.name)
    varied = unique(req.vary) or [memprobe_hint.default_vary(src.trainer_cfg) or "batch_size"]
    cfg = source.job_config(src.trainer_cfg, source.parse_set(req.sets), varied, f"run {src.run}")
    declared = dict(rc.memprobe.remedies) if rc.memprobe else {}
    available = {**remedies.implied(cfg, req.accum), **declared}  # the run's own declaration wins
    unknown = [r for r in req.remedy_names if r not in available]
    if unknown:
        have = ", ".join(available) or "none: declare them in run.yaml as memprobe: {remedies: {NAME: {KEY: VALUE}}}"
        raise GlueError(f"--remedy {unknown[0]}: run {src.run} has no such remedy (it has: {have})")
    chosen = unique(req.remedy_names) or list(available)
    device = "cuda" if (req.device or ("cuda" if src.failure.get("failure_class") == "oom_gpu" else "cpu")
                        ).startswith("cuda") else "cpu"
    if req.memory_limit_mb is not None:
        limit, limit_source = req.memory_limit_mb, "--memory-limit-mb"
    elif src.memory_limit_mb:
        limit, limit_source = src.memory_limit_mb, f"the limit of run {src.run}'s attempt {src.failure.get('attempt')}"
    else:
        limit, limit_source = None, "the VM's own memory" if device == "cpu" else "the GPU's own capacity"
    host = job.pick_host(home, req.vm, src.failure.get("vm"))
    stamp = report_out.utc_stamp()
    local_out = req.out_path or (Path(f"memprobe-{stamp}.json") if store is None else None)
    if local_out is not None:
        check_out(local_out)
    snapshot = Path(tempfile.gettempdir()) / f"memprobe-{stamp}.snapshot.pickle" \
        if device == "cuda" and not req.no_breakdown else None
    opts = investigate.Options(
        vary=varied, ranges=source.parse_ranges(req.ranges, varied), grid=req.grid, device=device,
        memory_limit_mb=limit, limit_source=limit_source, mechanism=req.limit_mechanism,
        trial_steps=req.trial_steps, accept_steps=req.accept_steps, tolerance=req.tolerance, accum=req.accum,
        remedies=() if req.no_remedies else tuple(chosen), breakdown=not req.no_breakdown,
        remedies_at=req.remedies_at, trial_timeout_s=req.trial_timeout, progress=progress, snapshot_path=snapshot,
        declared=declared, run=src.run, config_path=src.config_path,
        acceptance={k: {"min": t.min, "max": t.max} for k, t in (rc.evaluation.metrics if rc.evaluation
                                                                    else {}).items()},
    )
    manifest = src.manifest
    if store is None and req.config_path is not None:  # a run.yaml: its workdir and requirements shipped first
        ws = job.ship(home, host, trials_store, rc, req.config_path)
        manifest = dataclasses.replace(manifest, workdir=ws.package, requirements=ws.requirements)
    progress(f"preparing {src.description}'s code and requirements on {host.name}", None)
    opts.job = job.JobTrials.prepare(home, trials_store, manifest, rc, host)
    return Session(req, src, store, cfg, opts, stamp, local_out)

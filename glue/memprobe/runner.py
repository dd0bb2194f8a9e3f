"""Run one trial in a fresh process under a memory limit and say what happened: it fit, it ran out
of memory at that input (an exception inside it, or the kernel's OOM killer under the cgroup), or
something else went wrong (an error, a timeout). memprobe itself never dies with its trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glue.memprobe.limits import TrialLimit
from glue.train.layout import EVALUATIONS_PREFIX

RECORDS = "records"  # the probe folder's stand-in for the run's records (glue.train.run.context in probe mode)

FIT, OOM, ERROR, TIMEOUT = "fit", "oom", "error", "timeout"


@dataclass
class TrialOutcome:
    status: str                                  # fit | oom | error | timeout
    changed: dict[str, Any]                      # what differs from the config (the input under test)
    peak_rss_mb: float | None = None             # the trial process's own peak RSS (VmHWM / wait4 maxrss)
    rss_base_mb: float | None = None             # its RSS after importing torch: the runtime's share
    cgroup_peak_mb: float | None = None
    cuda: dict[str, Any] | None = None           # max_allocated_mb / max_reserved_mb / total_mb
    phase: str | None = None                     # where an OOM struck: build / forward / backward / optimizer
    error: str | None = None
    evidence: str | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    steps_run: int | None = None
    step_s: float | None = None
    wall_s: float | None = None
    limit: str | None = None
    exit: int | None = None
    evaluation: dict[str, Any] | None = None     # the last evaluation the trainer recorded in the trial (a job's)
    detail: dict[str, Any] = field(default_factory=dict)  # the worker's full record

    @property
    def peak_mb(self) -> float | None:
        """The figure compared across trials: CUDA max allocated on a GPU, peak RSS on the host."""
        if self.cuda and self.cuda.get("max_allocated_mb") is not None:
            return float(self.cuda["max_allocated_mb"])
        return self.peak_rss_mb

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["peak_mb"] = self.peak_mb
        return out


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and "USDT:" not in ln]
    return "\n".join(keep[-lines:])


def _wait(pid: int, timeout_s: float) -> tuple[int, float, bool]:
    """(returncode as Popen reports it, child's maxrss in MB, timed out) via wait4 for this child."""
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            break
        if time.monotonic() > deadline:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.05)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, round(usage.ru_maxrss / 1024, 1), timed_out


def run_trial(spec: dict[str, Any], changed: dict[str, Any], *, limit_mb: int | None, mechanism: str = "auto",
              timeout_s: float = 600.0) -> TrialOutcome:
    """Start `python -m glue.memprobe.worker` with `spec`, under a host-memory limit when the device is
    the CPU (on CUDA the limit travels in the spec as a cap on the GPU allocator), and classify."""
    device = str(spec.get("device", "cpu"))
    if limit_mb and device != "cpu":
        spec = {**spec, "gpu_limit_mb": limit_mb}
    with tempfile.TemporaryDirectory(prefix="memprobe-trial-") as tmp:
        work = Path(tmp)
        spec_path, result_path = work / "spec.json", work / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.setdefault("OMP_NUM_THREADS", str(spec.get("cfg", {}).get("threads") or 1))
        argv = [sys.executable, "-m", "glue.memprobe.worker", str(spec_path), str(result_path)]
        return run_command(argv, changed, env=env, result_path=result_path,
                           limit_mb=limit_mb if device == "cpu" else None, mechanism=mechanism, timeout_s=timeout_s,
                           gpu_cap=limit_mb if device != "cpu" else None)


def run_command(argv: list[str], changed: dict[str, Any], *, env: dict[str, str], result_path: Path,
                limit_mb: int | None, mechanism: str = "auto", timeout_s: float = 600.0, cwd: str | None = None,
                gpu_cap: int | None = None) -> TrialOutcome:
    """Run one trial process (the memprobe worker, or the user's own command in probe mode: both write
    `result_path`), under a host-memory limit of limit_mb when given, and classify how it ended."""
    host_limit = TrialLimit(limit_mb, mechanism) if limit_mb else None
    log_path = result_path.with_name("trial.log")
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, preexec_fn=host_limit.preexec if host_limit else None)
        code, maxrss, timed_out = _wait(proc.pid, timeout_s)
        proc.returncode = code
        wall = round(time.monotonic() - started, 2)
        outcome = _classify(code, timed_out, result_path, log_path, host_limit, timeout_s)
        outcome.changed = dict(changed)
        outcome.evaluation = last_evaluation(result_path.parent / RECORDS)
        outcome.wall_s = wall
        outcome.exit = code
        outcome.peak_rss_mb = max(x for x in (outcome.peak_rss_mb, maxrss) if x is not None) \
            if (outcome.peak_rss_mb or maxrss) else None
        if host_limit is not None:
            outcome.cgroup_peak_mb = host_limit.peak_mb()
            outcome.limit = host_limit.describe()
        elif gpu_cap:
            outcome.limit = f"CUDA allocator cap {gpu_cap} MB"
        return outcome
    finally:
        if host_limit is not None:
            host_limit.remove()


def last_evaluation(records: Path) -> dict[str, Any] | None:
    """The evaluation a probed trainer recorded last (record_evaluation, kept in the probe folder's records):
    the newest one marked final, else the one at the highest step; None when it recorded none."""
    found: list[dict[str, Any]] = []
    for path in sorted(records.glob(EVALUATIONS_PREFIX + "*.json")) if records.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("metrics"), dict):
            found.append({k: rec.get(k) for k in ("step", "metrics", "final")})
    if not found:
        return None
    return max(found, key=lambda r: (bool(r.get("final")), int(r.get("step") or 0)))


def _classify(code: int, timed_out: bool, result_path: Path, log_path: Path, limit: TrialLimit | None,
              timeout_s: float) -> TrialOutcome:
    try:
        res: dict[str, Any] = json.loads(result_path.read_text())
    except (OSError, ValueError):
        res = {}
    out = TrialOutcome(status=ERROR, changed={}, detail=res)
    out.rss_base_mb = res.get("rss_base_mb")
    out.peak_rss_mb = res.get("peak_rss_mb")
    out.cuda = res.get("cuda")
    try:
        out.phase = result_path.with_name(result_path.name + ".phase").read_text().strip() or res.get("phase")
    except OSError:
        out.phase = res.get("phase")
    out.loss_first, out.loss_last = res.get("loss_first"), res.get("loss_last")
    out.steps_run, out.step_s = res.get("steps_run"), res.get("step_s")
    if out.phase is None:  # no marker yet: it never got past importing torch
        out.phase = "startup"
    kills = limit.oom_kills() if limit is not None else 0
    status = res.get("status")
    if timed_out:
        out.status, out.error = TIMEOUT, f"no result within {timeout_s:.0f} s (killed); raise --trial-timeout"
    elif status == "ok" and code == 0:
        out.status = FIT
    elif status == "oom":
        out.status, out.error = OOM, res.get("error")
        out.evidence = f"{res.get('error')} (in {res.get('phase')})"
    elif code == -signal.SIGKILL and kills > 0:
        out.status = OOM
        out.error = f"killed by the kernel OOM killer in {out.phase}"
        out.evidence = (f"SIGKILL with {kills} oom_kill event(s) in {limit.path}"
                        f" (limit {limit.limit_mb} MB)" if limit else "SIGKILL")
    else:
        why = f"signal {-code}" if code < 0 else f"exit {code}"
        out.error = res.get("error") or f"trial process ended with {why}"
        out.evidence = _tail(log_path)
    return out

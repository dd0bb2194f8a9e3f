"""Slurm figures on the local backend (issue 53), each against a baseline measured in the same run.

    .venv/bin/python bench/slurm.py

Flow, on one cluster of 3 VMs x 1 GPU (the slurm role's stand-in devices):
  slurm     `glue up --scheduler slurm`; four 60-step runs deployed at once (three train, one waits for a
            GPU); one 60-step run alone; then a run whose node's VM is destroyed at step 25 under
            `glue watch --interval 1` (the node marked down, its requeued job started at once, the VM replaced)
  direct    `glue up --scheduler none` (the same VMs, Slurm stopped); one 60-step run deployed as before;
            then a run whose VM is destroyed at step 25, recovered by `glue watch --interval 1`
Figures:
  overhead        the 60-step run, `glue deploy` started -> its exit record, Slurm against direct (goal <= 1.03x)
  queue start     a GPU freed (the first run's exit record) -> the queued run's first step (goal <= 2 s)
  lost node       the VM destroyed -> the restarted attempt's first step, both under `glue watch`: Slurm's
                  requeue against glue's recovery without Slurm (goal <= 1.3x)
Each lost-node path is checked: Slurm's restart must be attempt 2 of the same job with its resume verified,
the direct one a verified recovery; the bench exits 1 naming what differed otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from polling import step_of, until  # bench/polling.py

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.paths import PROJECT_ROOT
from glue.runs.store import RunStore, parse_iso

GLUE = [sys.executable, "-m", "glue.cli"]
STEPS = {"steps": 60, "step_sleep": 0.5, "checkpoint_interval": 20}
LOST = {"steps": 400, "step_sleep": 0.2, "checkpoint_interval": 10}
LOSE_AT = 25


class Bench:
    def __init__(self, home: Path, work: Path) -> None:
        self.home, self.work = home, work
        self.env = {**os.environ, "GPUKIT_HOME": str(home)}

    def glue(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([*GLUE, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise SystemExit(f"bench: glue {' '.join(args)} exited {res.returncode}: {res.stderr.strip()[-600:]}")
        return res

    def config(self, name: str, overrides: dict[str, Any], slurm: bool) -> Path:
        cfg = yaml.safe_load((PROJECT_ROOT / "examples" / "tiny_gpt.yaml").read_text())
        cfg["config"].update(overrides)
        cfg["checkpoint"]["interval_steps"] = overrides["checkpoint_interval"]
        cfg["monitor"]["stall_timeout_seconds"] = 300
        if slurm:
            cfg["resources"] = {"gpus_per_node": 1, "time": "01:00:00"}
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def store(self, run: str) -> RunStore:
        return RunStore.open(self.home, run)


def epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()


def first_step_at(store: RunStore, attempt: int) -> float | None:
    steps = store.metrics(0).get(attempt) or {}
    return epoch(steps[min(steps)]["t"]) if steps else None


def ended_at(store: RunStore, attempt: int = 1) -> float | None:
    rec = store.exit_record(attempt, 0)
    return epoch(rec["ended_at"]) if rec else None


def deploy_to_end(b: Bench, run: str, slurm: bool) -> float:
    """`glue deploy` started -> the run's exit record (attempt 1)."""
    t0 = time.time()
    b.glue("deploy", "--run", run, "--config", str(b.config(run, STEPS, slurm)))
    end = until(f"{run} ends", lambda: ended_at(b.store(run)))
    return float(end - t0)


def queued_start(b: Bench) -> float:
    """Four runs at once on three GPUs: a GPU freed -> the waiting run's first step."""
    runs = ["s1", "s2", "s3", "s4"]
    procs = [subprocess.Popen([*GLUE, "deploy", "--run", r, "--config", str(b.config(r, STEPS, True))],
                              env=b.env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL) for r in runs]
    for p in procs:
        _, said = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"bench: a Slurm deploy failed: {said.strip()[-600:]}")
    ends = {r: until(f"{r} ends", lambda r=r: ended_at(b.store(r))) for r in runs}
    last = max(runs, key=lambda r: first_step_at(b.store(r), 1) or 0.0)  # the one that waited
    freed = min(t for r, t in ends.items() if r != last)
    first = first_step_at(b.store(last), 1)
    if first is None or first < freed:
        raise SystemExit(f"bench: {last} did not wait for a GPU (first step before any run ended): no queue measured")
    return float(first - freed)


def lose_vm(b: Bench, run: str) -> tuple[float, Any]:
    store = b.store(run)
    until(f"{run} reaches step {LOSE_AT}", lambda: step_of(store, 1) >= LOSE_AT, 600)
    vm = store.read_attempt(1)
    assert vm is not None
    t_lost = time.time()
    LocalBackend(b.home).delete_vm(str(vm.vm_id))
    first = until(f"{run}'s restarted attempt trains", lambda: first_step_at(store, 2), 900)
    return float(first - t_lost), store


def watch(b: Bench, run: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*GLUE, "watch", "--run", run, "--interval", "1"], env=b.env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def stop(watcher: subprocess.Popen[str]) -> None:
    watcher.terminate()
    watcher.wait(timeout=120)


def on_head(b: Bench, command: str) -> None:
    b.glue("ssh", "gpukit-1", "--", "sh", "-c", command)


def lost_with_slurm(b: Bench) -> float:
    """The run placed on gpukit-2 (the others drained while it starts): losing the head (gpukit-1, slurmctld)
    is another failure, whose runs are not yet resubmitted."""
    on_head(b, "scontrol update nodename=gpukit-1,gpukit-3 state=drain reason=bench-placement")
    try:
        b.glue("deploy", "--run", "lost-s", "--config", str(b.config("lost-s", LOST, True)))
        until("lost-s starts", lambda: b.store("lost-s").read_attempt(1), 300)
    finally:
        on_head(b, "for n in gpukit-1 gpukit-3; do scontrol update nodename=$n state=resume; done; true")
    watcher = watch(b, "lost-s")  # marks the node down, lets the requeued job start, replaces the VM
    try:
        took, store = lose_vm(b, "lost-s")
        jobs = [(a.scheduler or {}).get("job_id") if a else None
                for a in (store.read_attempt(1), store.read_attempt(2))]
        if jobs[0] is None or jobs[0] != jobs[1]:
            raise SystemExit("bench: the lost node's run did not restart as the same Slurm job (Slurm's requeue)")
        until("lost-s's restart verified", lambda: any(r.verified for r in store.read_recoveries()), 600)
    finally:
        stop(watcher)
    b.glue("stop", "--run", "lost-s")
    return took


def lost_direct(b: Bench) -> float:
    b.glue("deploy", "--run", "lost-d", "--config", str(b.config("lost-d", LOST, False)))
    watcher = watch(b, "lost-d")
    try:
        took, store = lose_vm(b, "lost-d")
        rec = until("lost-d's recovery record", lambda: (store.read_recoveries() or [None])[-1], 600)
        if not rec.verified:
            raise SystemExit("bench: the direct recovery was not verified: not the path measured")
    finally:
        stop(watcher)
    b.glue("stop", "--run", "lost-d")
    return took


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (the local backend's VMs)")
    work = Path(tempfile.mkdtemp(prefix="gpukit-bench-slurm-"))
    home = work / "home"
    home.mkdir()
    b = Bench(home, work)
    try:
        b.glue("up", "--vms", "3", "--scheduler", "slurm", timeout=1800)
        queue_s = queued_start(b)
        slurm_run = deploy_to_end(b, "s5", True)  # alone on the idle cluster, as the direct one below
        lost_s = lost_with_slurm(b)
        b.glue("up", "--scheduler", "none", timeout=1800)
        direct_run = deploy_to_end(b, "d1", False)
        lost_d = lost_direct(b)
    finally:
        subprocess.run([*GLUE, "down", "--force"], env=b.env, capture_output=True, timeout=600)
        LocalBucket(home).stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"60-step run, deploy -> end: Slurm {slurm_run:.1f} s, direct {direct_run:.1f} s: "
          f"{slurm_run / direct_run:.2f}x (goal <= 1.03x)")
    print(f"queued run: a GPU freed -> its first step {queue_s:.1f} s (goal <= 2 s)")
    print(f"lost node -> first resumed step: Slurm {lost_s:.1f} s, glue watch without Slurm {lost_d:.1f} s: "
          f"{lost_s / lost_d:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()

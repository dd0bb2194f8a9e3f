"""`glue watch` figures on the local backend (issue 16), against a baseline measured in the same run.

    .venv/bin/python bench/watch.py

Flow: up (2 VMs) -> three runs of tiny_gpt (checkpoint every 20 steps), each losing its VM at step 50:
  baseline   nobody watching: a tight loop here polls the backend every 0.2 s and calls `glue recover`
             (recover()) the moment the VM is gone: the best a human-free script could do by hand
  watch      `glue watch --run X --interval 1` (a real process) and an unannounced loss (VM deleted)
  notice     the same, the loss announced: notice file on the VM, 5 s grace, then the VM is deleted
Figures per run: detection latency (VM gone -> the failure classified, from the incident), failure ->
first resumed step, and steps replayed (failure step - checkpoint step). Ratios: watch vs baseline
(failure -> first resumed step), and steps replayed with the notice vs without. Every recovery must take the
same path for the ratios to mean anything: a new VM that configures itself from the seed `up` took (the
baseline's by what the recovery's phases returned, the watcher's by what it said and its record:
bench/path_check.py); the bench exits 1 naming the path expected and the one taken otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

import path_check  # bench/path_check.py
from polling import step_of, until  # bench/polling.py
from rich.console import Console

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.cluster import current
from glue.operations import lifecycle
from glue.operations.recovery import recover as recover_mod
from glue.paths import PROJECT_ROOT
from glue.runs import deploy as deploy_mod
from glue.runs.store import RunStore, parse_iso
from glue.train import layout

OVERRIDES = {"steps": 160, "step_sleep": 0.05, "checkpoint_interval": 20}
LOSE_AT = 50


def _figures(store: RunStore, lost_at: datetime) -> dict[str, float]:
    rec = until("recovery record", lambda: store.get_json(layout.recovery_key(1)))
    incident = store.get_json(str(store.attempt(1)["incident"]))
    first_t = min(m["t"] for m in store.metrics()[2].values())
    return {"detect_s": (parse_iso(incident["detected_at"]) - lost_at).total_seconds(),
            "to_first_step_s": (parse_iso(first_t) - lost_at).total_seconds(),
            "replayed": float(rec["failure_step"] - (rec["checkpoint_step"] or 0)),
            "verified": float(rec["verified"])}


def baseline(home: Path, console: Console, run: str) -> dict[str, float]:
    deploy_mod.deploy(home, run, PROJECT_ROOT / "examples" / "tiny_gpt.yaml", "gpukit-1", False, console,
                      config_overrides=OVERRIDES)
    store = RunStore.open(home, run)
    until("step", lambda: step_of(store, 1) >= LOSE_AT)
    backend, vm = LocalBackend(home), store.attempt(1)["vm_id"]
    backend.delete_vm(vm)
    lost_at = datetime.now(UTC)
    until("the loss seen", lambda: backend.read_vm(vm) is None, 30)
    with path_check.watching() as seen:
        result = recover_mod.recover(home, run, console).to_dict()
    path_check.expect("seed", path_check.recovery_path(seen, result), f"the recovery of {run}")
    return _figures(store, lost_at)


def watched(home: Path, run: str, notice: bool) -> dict[str, float]:
    console = Console(stderr=True, quiet=True)
    deploy_mod.deploy(home, run, PROJECT_ROOT / "examples" / "tiny_gpt.yaml", "gpukit-1", False, console,
                      config_overrides=OVERRIDES)
    store = RunStore.open(home, run)
    log_path = home / f"watch-{run}.log"
    log = open(log_path, "w")  # closed below
    proc = subprocess.Popen([sys.executable, "-m", "glue.cli", "watch", "--run", run, "--interval", "1"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        until("step", lambda: step_of(store, 1) >= LOSE_AT)
        vm = store.attempt(1)["vm_id"]
        backend = LocalBackend(home)
        if notice:
            lost_at = datetime.now(UTC)  # the notice is the failure's start: from here the run is doomed
            threading.Thread(target=backend.announce_termination, args=(vm, 5.0), daemon=True).start()
        else:
            backend.delete_vm(vm)
            lost_at = datetime.now(UTC)
        figures = _figures(store, lost_at)
        rec = store.get_json(layout.recovery_key(1))
        path_check.expect("seed", path_check.said_path(log_path.read_text(), rec["new_vm"]["name"], rec),
                          f"the recovery of {run} by glue watch")
        return figures
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main() -> None:
    os.environ.setdefault("GPUKIT_IMAGES", str(PROJECT_ROOT / ".gpukit" / "images"))  # no bake per run
    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-watch-"))
    os.environ["GPUKIT_HOME"] = str(home)
    console = Console(stderr=True, quiet=True)
    try:
        lifecycle.up(home, current.ClusterConfig(vms=2), console)
        base = baseline(home, console, "bench-manual")
        plain = watched(home, "bench-watch", notice=False)
        announced = watched(home, "bench-notice", notice=True)
        lifecycle.down(home, console, force=True)
    finally:
        backend = LocalBackend(home)
        for v in backend.list_vms():
            backend.delete_vm(v.id)
        LocalBucket(home).stop()
        shutil.rmtree(home, ignore_errors=True)
    print(f"{'':36} {'detect s':>9} {'fail->1st step s':>17} {'replayed':>9} {'verified':>9}")
    for name, f in (("baseline: recover at detection", base), ("glue watch, unannounced loss", plain),
                    ("glue watch, termination notice", announced)):
        print(f"{name:36} {f['detect_s']:9.2f} {f['to_first_step_s']:17.2f} {f['replayed']:9.0f} "
              f"{'yes' if f['verified'] else 'NO':>9}")
    ratio = plain["to_first_step_s"] / base["to_first_step_s"]
    print(f"watch vs baseline, failure -> first resumed step: {ratio:.2f}x")
    print(f"steps replayed, notice vs none: {announced['replayed']:.0f} vs {plain['replayed']:.0f} "
          f"(goal: <= 1 with the notice)")


if __name__ == "__main__":
    main()

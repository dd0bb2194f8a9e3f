"""Recovery of the Hugging Face example (examples/hf_trainer: train.py in a workdir, transformers and its
dependencies from requirements.txt) on the local backend, against a baseline measured in the same run: the
cold start of the same trainer (its attempt's start -> step 1) on a configured VM.

Flow: up (2 VMs) -> deploy the example (its set installed from the wheelhouse and packed into the bucket)
-> destroy its VM at step 25 -> glue recover onto a new VM that configures itself from the seed (the
environment unpacked from the pack); then `glue up --spares 1` -> deploy again -> destroy its VM -> glue
recover onto the warm spare -> down. Issue 51's figures: failure detected -> first resumed step on a new
seeded VM (goal <= 8 s) and on a spare (goal <= 2 s), prepare's share of it, the spare's restore against the
cold start, and how the spare's trainer started: the deploy makes the spare hold the run's environment with a
warm process in it (glue.operations.warm_spares.after_deploy, as `glue deploy` does), which loads the modules
the run recorded; the bench waits for that and exits 1 unless the spare's trainer started warm. The pack against
`pip install --no-index` from the same wheelhouse is bench/env_prepare.py's (12.3x, docs/benchmarks.md).
Each recovery must take the path it measures (bench/path_check.py), else the bench exits 1.

    .venv/bin/python bench/recovery_hf.py
"""

from __future__ import annotations

import time
from typing import Any

from recovery import after, expect_warm, lose_and_recover, remove_everything, temp_home  # bench/recovery.py
from rich.console import Console

from glue.cluster import current
from glue.infra import ssh
from glue.operations import lifecycle, warm_spares
from glue.paths import PROJECT_ROOT
from glue.runs import deploy as deploy_mod
from glue.runs.store import RunStore, parse_iso
from glue.train.run.start import WARM_DIR

CONFIG = PROJECT_ROOT / "examples" / "hf_trainer" / "run.yaml"
OVERRIDES = {"steps": 400, "step_sleep": 0.05}
TARGET_SPARE = 2.0  # issue 51
TARGET_SEED = 8.0  # issue 35 / 51


def cold_start(home: Any, console: Console) -> float:
    """The baseline: the example's 3-step run on a configured VM whose environment is ready (the pack unpacked
    by the deploy before); its attempt's start -> step 1."""
    rec = deploy_mod.deploy(home, "hf-cold", CONFIG, "gpukit-2", False, console,
                            config_overrides={"steps": 3, "step_sleep": 0})
    store = RunStore.open(home, "hf-cold")
    deadline = time.monotonic() + 300
    while 1 not in store.metrics().get(1, {}):
        if time.monotonic() > deadline:
            raise SystemExit("the cold start's first step never came")
        time.sleep(0.2)
    after(home, "hf-cold", 1)
    return (parse_iso(store.metrics()[1][1]["t"]) - parse_iso(rec["started_at"])).total_seconds()


def wait_imports_loaded(home: Any, spare: str, run: str, timeout: float = 300) -> None:
    """The spare's warm process for the run's environment has loaded the modules the run recorded."""
    [host] = [h for h in current.all_hosts(home) if h.name == spare]
    deadline = time.monotonic() + timeout
    while f"run {run}: loaded" not in ssh.run(home, host, f"cat {WARM_DIR}/warm.log", timeout=20).stdout:
        if time.monotonic() > deadline:
            raise SystemExit(f"{spare}: the warm process never loaded run {run}'s recorded imports")
        time.sleep(1)


def to_first_step(result: dict[str, Any]) -> float:
    s = result["seconds"]
    return float(sum(s.get(k) or 0.0 for k in ("validate", "provision", "configure", "verify", "prepare", "restore")))


def show(label: str, res: dict[str, Any], target: float, cold: float) -> None:
    s = res["seconds"]
    total = to_first_step(res)
    how = (res["nodes"][0].get("trainer_start") or {}) if res.get("nodes") else {}
    print(f"\n{label}: " + ", ".join(f"{k} {s.get(k) or 0.0:.2f}" for k in
                                   ("validate", "provision", "configure", "verify", "prepare", "restore")))
    print(f"{'failure detected -> first resumed step':44} {total:8.2f}   target <= {target:.0f} s "
          f"(ratio {total / target:.2f}); verified: {res['verified']}")
    print(f"{'  of it, prepare (the environment)':44} {s.get('prepare') or 0.0:8.2f}")
    print(f"{'  restore vs cold start (ratio)':44} {s['restore'] / cold:8.2f}x  ({s['restore']:.2f} s against "
          f"{cold:.2f} s)")
    print(f"{'  the trainer started':44} {how.get('start', '?'):>8}   {how.get('cold_reason') or ''}")
    print(f"{'  recover() called -> first resumed step':44} {res['bench_wall_to_first']:8.2f}")


def main() -> None:
    home = temp_home("gpukit-bench-rechf-")
    console = Console(stderr=True, quiet=True)
    try:
        lifecycle.up(home, current.ClusterConfig(vms=2), console)
        deploy_mod.deploy(home, "hf-seed", CONFIG, "gpukit-1", False, console, config_overrides=OVERRIDES)
        cold = cold_start(home, console)  # beside it: the set is packed by now, gpukit-2 unpacks it
        seeded = lose_and_recover(home, console, "hf-seed", "seed")
        after(home, "hf-seed", 2)
        lifecycle.up(home, current.ClusterConfig(vms=2, spares=1), console)
        deploy_mod.deploy(home, "hf-spare", CONFIG, "gpukit-1", False, console, config_overrides=OVERRIDES)
        warm_spares.after_deploy(home, console, "hf-spare")  # as `glue deploy` does
        wait_imports_loaded(home, "gpukit-spare-1", "hf-spare")
        spare = lose_and_recover(home, console, "hf-spare", "spare")
        expect_warm(spare)
        after(home, "hf-spare", 2)
        lifecycle.down(home, console, force=True)
    finally:
        remove_everything(home)
    print(f"{'baseline: cold start of the HF trainer':44} {cold:8.2f}   (its attempt's start -> step 1)")
    show("a new VM that configured itself from the seed", seeded, TARGET_SEED, cold)
    show(f"a warm spare ({spare['new_vm'].get('spare')})", spare, TARGET_SPARE, cold)


if __name__ == "__main__":
    main()

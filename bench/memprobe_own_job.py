"""memprobe on a user's own job (issue 48): what the search saves, and what a probe trial costs.

    .venv/bin/python bench/memprobe_own_job.py [--reps 3] [--limit-mb 700]

The user trainer is tests/e2e/test_memprobe_own_job.py's (a wide input, a small MLP, its own loop with
glue.train's RunContext), run here as trial processes exactly as glue.memprobe.vm_trial runs them on a VM
(glue.memprobe.runner.run_command: a memory cgroup at --limit-mb, the probe variables set), without VMs.

1. Trials to the boundary: memprobe's search (glue.memprobe.search.find_boundary, the config's value
   first, then bisection) against a linear scan upward from the range's low end until the first OOM, both
   run for real over batch_size 2048:65536 (pow2: 6 candidates), trials and seconds each. For the int grid
   of the same range the scan's count is computed (the boundary's index + 1), not run.
2. Per-trial overhead: a probe trial of K=2 steps (RunContext in probe mode: hooks, the K-step stop, the
   result file) against a plain start of the same command with `steps: 2` (its RunContext writing its records
   to a bucket folder through the mount, as a serverless run does). Alternating, medians; goal <= 1.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from glue.memprobe import search
from glue.memprobe.runner import FIT, OOM, run_command
from glue.train import trainer_vars as V
from glue.train.layout import run_uri
from glue.train.run.launch import TrainerEnv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.test_memprobe_own_job import TRAIN  # the e2e's user trainer, one copy

CONFIG = {"features": 2048, "batch_size": 65536, "lr": 0.01, "steps": 40, "grad_accum": 1}


def _project(root: Path) -> Path:
    (root / "mp_dep.py").write_text("SCALE = 0.5\n")
    (root / "train.py").write_text(TRAIN)
    return root / "train.py"


def _env(root: Path, cfg: dict[str, Any], probe: bool) -> dict[str, str]:
    records = run_uri("gpukit", "bench")
    env = TrainerEnv(run="bench", checkpoint=records, outputs=f"{records}/outputs", bucket_name="gpukit", config=cfg,
                     via_mount=True, bucket_mount=str(root / "mnt"), scratch=str(root / "scratch")).to_env()
    out = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    if probe:
        out.update({V.PROBE_DIR: str(root / "probe"), V.PROBE_STEPS: "2"})
    return out


def _trial(root: Path, script: Path, cfg: dict[str, Any], limit_mb: int | None,
           probe: bool = True) -> tuple[str, float]:
    folder = root / "probe"
    folder.mkdir(exist_ok=True)
    t0 = time.monotonic()
    out = run_command([sys.executable, str(script)], {"batch_size": cfg["batch_size"]},
                      env=_env(root, cfg, probe), result_path=folder / "result.json", limit_mb=limit_mb,
                      cwd=str(root))
    wall = time.monotonic() - t0
    status = out.status if probe else (FIT if out.exit == 0 else f"exit {out.exit}")
    return status, wall


def boundary(root: Path, script: Path, limit_mb: int) -> dict[str, Any]:
    values = search.candidates(2048, 65536, "pow2")
    t0 = time.monotonic()
    found = search.find_boundary(lambda v: _trial(root, script, {**CONFIG, "batch_size": v}, limit_mb)[0], values,
                                 start=CONFIG["batch_size"])
    bisect_s = time.monotonic() - t0
    t0, scanned = time.monotonic(), 0
    for v in values:
        scanned += 1
        if _trial(root, script, {**CONFIG, "batch_size": v}, limit_mb)[0] == OOM:
            break
    scan_s = time.monotonic() - t0
    fit = found.largest_fit or 2048
    int_scan = fit - 2048 + 2  # every integer up to the largest fit, then the first that fails
    int_bound = search.trial_bound(65536 - 2048 + 1)
    return {"pow2": {"candidates": len(values), "search_trials": found.trials, "search_s": round(bisect_s, 1),
                     "scan_trials": scanned, "scan_s": round(scan_s, 1), "largest_fit": found.largest_fit,
                     "smallest_fail": found.smallest_fail},
            "int": {"candidates": 65536 - 2048 + 1, "search_bound": int_bound, "scan_trials_computed": int_scan}}


def overhead(root: Path, script: Path, reps: int) -> dict[str, Any]:
    cfg = {**CONFIG, "batch_size": 4096, "steps": 2}
    probe_s, plain_s = [], []
    for _ in range(reps):  # alternating: load from anything else on the machine hits both alike
        status, wall = _trial(root, script, cfg, None, probe=True)
        assert status == FIT, status
        probe_s.append(wall)
        status, wall = _trial(root, script, cfg, None, probe=False)
        assert status == FIT, status
        plain_s.append(wall)
    p, q = statistics.median(probe_s), statistics.median(plain_s)
    return {"probe_trial_s": round(p, 2), "plain_start_s": round(q, 2), "ratio": round(p / q, 3), "reps": reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit-mb", type=int, default=700)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memprobe-") as tmp:
        root = Path(tmp)
        script = _project(root)
        figures = {"boundary": boundary(root, script, args.limit_mb), "overhead": overhead(root, script, args.reps)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

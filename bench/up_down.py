"""Seconds for `glue up` (2 VMs, setup already done) and `glue down`, against a baseline measured in
the same run: the bare `terraform version` + provider start cost (terraform plan of an empty change).

Targets (issue 2): up <= 10 s, down <= 5 s on the 2-core dev machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GLUE = [sys.executable, "-m", "glue.cli"]


def timed(args: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-"))
    env = {"GPUKIT_IMAGES": str(Path(__file__).resolve().parents[1] / ".gpukit" / "images"), **os.environ,
           "GPUKIT_HOME": str(home)}  # the project's image cache: no bake per run
    timed([*GLUE, "up", "--vms", "2", "--no-configure"], env)  # warm: init, keys, bucket
    timed([*GLUE, "down"], env)
    rounds = 3
    ups, downs, noops = [], [], []
    for _ in range(rounds):
        ups.append(timed([*GLUE, "up", "--vms", "2", "--no-configure"], env))
        noops.append(timed([*GLUE, "up", "--vms", "2", "--no-configure"], env))  # baseline: nothing to do
        downs.append(timed([*GLUE, "down"], env))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"{'figure':38} {'seconds':>8} {'target':>7} {'vs no-op up':>12}")
    print(f"{'glue up, 2 VMs (no playbook)':38} {med(ups):8.2f} {10:7.1f} {med(ups) / med(noops):11.2f}x")
    print(f"{'glue down, 2 VMs':38} {med(downs):8.2f} {5:7.1f} {med(downs) / med(noops):11.2f}x")
    print(f"{'baseline: no-op glue up (terraform+provider)':38} {med(noops):8.2f}")
    from glue.cloud.local.bucket import LocalBucket

    LocalBucket(home).stop()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Seconds for `glue up` (2 VMs, configured and verified; after the warm-up the kit home has a configuration
seed, so the VMs configure themselves at first boot and only verify.yml runs), a `glue up` with nothing to change, and
`glue down`, each against a baseline measured in the same run: the no-change `glue up` as it was before
the convergence record (terraform apply + the playbook on every VM; forced by removing the record).

Targets (issue 35): up of 2 VMs <= 10 s, up with nothing to change <= 3 s, down <= 3 s (2-core machine).
Each `glue up` must take the path its figure names (bench/path_check.py: what it says on stderr); the bench
exits 1 naming the path expected and the one taken otherwise. The baseline passes --converge: with the record
removed, the seeded VMs would otherwise configure themselves again (verify.yml only), not run the playbook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import path_check  # bench/path_check.py

GLUE = [sys.executable, "-m", "glue.cli"]
VMS = ["gpukit-1", "gpukit-2"]


def timed(args: list[str], env: dict[str, str], path: str | None = None) -> float:
    """Seconds of one glue command; a `glue up` must have taken `path` (path_check.up_path)."""
    t = time.perf_counter()
    done = subprocess.run(args, env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL, text=True)
    seconds = time.perf_counter() - t
    if path is not None:
        path_check.expect(path, path_check.up_path(done.stderr + done.stdout, VMS), " ".join(args[len(GLUE):]))
    return seconds


def main() -> None:
    from glue.operations import convergence

    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-"))
    env = {"GPUKIT_IMAGES": str(Path(__file__).resolve().parents[1] / ".gpukit" / "images"), **os.environ,
           "GPUKIT_HOME": str(home)}  # the project's image cache: no bake per run
    first = timed([*GLUE, "up", "--vms", "2"], env, "playbook")  # a fresh kit home: init, keys, bucket, the wheel
    timed([*GLUE, "down"], env)
    rounds = 3
    ups, noops, fulls, downs = [], [], [], []
    for _ in range(rounds):
        ups.append(timed([*GLUE, "up", "--vms", "2"], env, "seed"))
        noops.append(timed([*GLUE, "up", "--vms", "2"], env, "nothing"))
        convergence.record_path(home).unlink()  # as before the record: apply + playbook on every VM
        fulls.append(timed([*GLUE, "up", "--vms", "2", "--converge"], env, "playbook"))
        downs.append(timed([*GLUE, "down"], env))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    base = med(fulls)
    print(f"{'figure (median of 3)':44} {'seconds':>8} {'target':>7} {'vs baseline':>12}")
    print(f"{'glue up, 2 VMs (apply, seed, verify)':44} {med(ups):8.2f} {10:7.1f} {med(ups) / base:11.2f}x")
    print(f"{'glue up, nothing to change':44} {med(noops):8.2f} {3:7.1f} {med(noops) / base:11.2f}x")
    print(f"{'glue down, 2 VMs':44} {med(downs):8.2f} {3:7.1f} {med(downs) / base:11.2f}x")
    print(f"{'baseline: no-change up as before (all work)':44} {base:8.2f}")
    print(f"{'first up in a fresh kit home (playbook)':44} {first:8.2f}   (no seed yet: the playbook configures)")
    from glue.cloud.local.bucket import LocalBucket

    LocalBucket(home).stop()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

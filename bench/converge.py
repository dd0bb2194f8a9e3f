"""Converge of fresh local VMs (site.yml), and the no-op re-run.

    .venv/bin/python bench/converge.py [--vms 2] [--rounds 1] [--json bench/out/converge.json]

Each round: create N fresh local VMs (and the local bucket) in a throwaway GPUKIT_HOME, run
site.yml (first converge), run it again (must report changed=0), delete the VMs. Prints seconds,
the ratio to the targets (first <= 20 s, no-op <= 6 s for 2 VMs on the reference machine), and a
baseline measured in the same run: a one-task playbook (ping) on the same VMs, i.e. the fixed cost
of starting ansible-playbook through ansible-runner and reaching the VMs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.infra import ansible
from glue.infra.ansible_testbed import LocalTestbed

TARGET_FIRST = 20.0
TARGET_NOOP = 6.0

BASELINE = """
- name: Baseline
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def one_round(vms: int, workdir: Path) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="bench-", dir=workdir))
    bed = LocalTestbed(home)
    try:
        bed.create(vms)
        first = ansible.converge(home, progress=False)
        if not first.ok:
            raise SystemExit(f"first converge failed: {first.failed}")
        noop = ansible.converge(home, progress=False)
        if not noop.ok:
            raise SystemExit(f"no-op converge failed: {noop.failed}")
        if any(noop.changed.values()):
            raise SystemExit(f"the re-run changed something: {noop.changed}")
        book = home / "baseline.yml"
        book.write_text(BASELINE)
        base = ansible.run_playbook(str(book), home, progress=False)
        if not base.ok:
            raise SystemExit(f"baseline failed: {base.failed}")
        return {"first": first.seconds, "noop": noop.seconds, "baseline": base.seconds}
    finally:
        bed.destroy()
        bed.stop_bucket()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vms", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("local VMs need root")
    workdir = Path(tempfile.mkdtemp(prefix="gpukit-bench-"))
    rounds = []
    try:
        for i in range(args.rounds):
            t0 = time.monotonic()
            r = one_round(args.vms, workdir)
            rounds.append(r)
            print(f"round {i + 1}: first {r['first']:.1f}s  no-op {r['noop']:.1f}s  baseline {r['baseline']:.1f}s"
                  f"  (round {time.monotonic() - t0:.0f}s)", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    first = statistics.median(r["first"] for r in rounds)
    noop = statistics.median(r["noop"] for r in rounds)
    base = statistics.median(r["baseline"] for r in rounds)
    load = os.getloadavg()[0]
    print(f"converge of {args.vms} fresh local VMs: {first:5.1f} s  target {TARGET_FIRST:.0f} s  "
          f"ratio {first / TARGET_FIRST:.2f}  ({first / base:.1f}x baseline)")
    print(f"no-op re-run (changed=0):       {noop:5.1f} s  target {TARGET_NOOP:.0f} s  "
          f"ratio {noop / TARGET_NOOP:.2f}  ({noop / base:.1f}x baseline)")
    print(f"baseline (one-task playbook):   {base:5.1f} s  load average {load:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"vms": args.vms, "rounds": rounds, "first": first, "noop": noop,
                                         "baseline": base, "target_first": TARGET_FIRST,
                                         "target_noop": TARGET_NOOP, "loadavg": load}, indent=2))


if __name__ == "__main__":
    main()

"""Converge of fresh local VMs (site.yml), and the no-op re-run.

    .venv/bin/python bench/converge.py [--vms 2] [--rounds 1] [--json bench/out/converge.json]

Each round: create N fresh local VMs (and the local bucket) in a throwaway GPUKIT_HOME, run
site.yml (first converge), run it again (must report changed=0), delete the VMs; then the same on
new VMs with Ansible's stock `linear` strategy (GPUKIT_ANSIBLE_STRATEGY=linear) as the baseline for
glue's Mitogen strategy. Prints seconds, the ratio to the targets (issue 13: first <= 10 s, no-op
<= 3 s for 2 VMs), the ratio to the stock strategy, and the fixed cost measured in the same run: a
one-task playbook (ping) on the same VMs (starting ansible-playbook through ansible-runner and
reaching the VMs). The gpukit wheel is cached per checkout (build/gpukit-wheels/<hash>): built by
the first converge of this source tree, reused by every later one, as in `glue up`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.infra import ansible, ansible_run
from tests.testbed import LocalTestbed

TARGET_FIRST = 10.0
TARGET_NOOP = 3.0

BASELINE = """
- name: Baseline
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def _vm_cpu(bed: LocalTestbed) -> float:
    """CPU seconds used inside the VMs' PID namespaces (live processes + the children they reaped)."""
    tck = os.sysconf("SC_CLK_TCK")
    namespaces = set()
    for vm_dir in (bed.home / "vms").iterdir():
        try:
            pid = json.loads((vm_dir / "state.json").read_text())["init_pid"]
            namespaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
        except (OSError, ValueError, KeyError):
            continue
    ticks = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "ns" / "pid") not in namespaces:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / tck


def _cpu(bed: LocalTestbed) -> float:
    """Controller (this process and its children: ansible-playbook, ssh) plus VM CPU seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + _vm_cpu(bed)


def one_round(vms: int, workdir: Path, strategy: str = "mitogen") -> dict[str, float]:
    os.environ["GPUKIT_ANSIBLE_STRATEGY"] = strategy
    home = Path(tempfile.mkdtemp(prefix="bench-", dir=workdir))
    bed = LocalTestbed(home)
    try:
        bed.create(vms)
        c0 = _cpu(bed)
        first = ansible.converge(home, progress=False)
        if not first.ok:
            raise SystemExit(f"first converge failed: {first.failed}")
        c1 = _cpu(bed)
        noop = ansible.converge(home, progress=False)
        c2 = _cpu(bed)
        if not noop.ok:
            raise SystemExit(f"no-op converge failed: {noop.failed}")
        if any(noop.changed.values()):
            raise SystemExit(f"the re-run changed something: {noop.changed}")
        book = home / "baseline.yml"
        book.write_text(BASELINE)
        (home / "group_vars").symlink_to(ansible_run.ANSIBLE_DIR / "group_vars")  # the pinned host keys
        base = ansible.run_playbook(str(book), home, progress=False)
        if not base.ok:
            raise SystemExit(f"baseline failed: {base.failed}")
        return {"first": first.seconds, "noop": noop.seconds, "baseline": base.seconds,
                "first_cpu": round(c1 - c0, 1), "noop_cpu": round(c2 - c1, 1)}
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
    rounds, stock = [], []
    try:
        for i in range(args.rounds):
            for strategy, into in (("mitogen", rounds), ("linear", stock)):
                t0 = time.monotonic()
                r = one_round(args.vms, workdir, strategy)
                into.append(r)
                print(f"round {i + 1} ({strategy}): first {r['first']:.1f}s (cpu {r['first_cpu']:.1f}s)  "
                      f"no-op {r['noop']:.1f}s (cpu {r['noop_cpu']:.1f}s)  baseline {r['baseline']:.1f}s  "
                      f"(round {time.monotonic() - t0:.0f}s, load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stock_first = statistics.median(r["first"] for r in stock)
    stock_noop = statistics.median(r["noop"] for r in stock)
    first = statistics.median(r["first"] for r in rounds)
    noop = statistics.median(r["noop"] for r in rounds)
    base = statistics.median(r["baseline"] for r in rounds)
    load = os.getloadavg()[0]
    print(f"converge of {args.vms} fresh local VMs: {first:5.1f} s  target {TARGET_FIRST:.0f} s  "
          f"ratio {first / TARGET_FIRST:.2f}  ({first / base:.1f}x baseline)")
    print(f"no-op re-run (changed=0):       {noop:5.1f} s  target {TARGET_NOOP:.0f} s  "
          f"ratio {noop / TARGET_NOOP:.2f}  ({noop / base:.1f}x baseline)")
    cpu_first = statistics.median(r["first_cpu"] for r in rounds)
    cpu_noop = statistics.median(r["noop_cpu"] for r in rounds)
    print(f"stock linear strategy:          first {stock_first:.1f} s, no-op {stock_noop:.1f} s "
          f"(Mitogen: {first / stock_first:.2f}x and {noop / stock_noop:.2f}x of it)")
    print(f"baseline (one-task playbook):   {base:5.1f} s  load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"CPU used (controller + VMs):    first {cpu_first:.1f} s, no-op {cpu_noop:.1f} s "
          f"(a lower bound for the wall time on {os.cpu_count()} idle CPUs: {cpu_first / (os.cpu_count() or 1):.1f} s,"
          f" {cpu_noop / (os.cpu_count() or 1):.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"vms": args.vms, "rounds": rounds, "first": first, "noop": noop,
                                         "baseline": base, "cpu_first": cpu_first, "cpu_noop": cpu_noop,
                                         "stock_rounds": stock, "stock_first": stock_first,
                                         "stock_noop": stock_noop,
                                         "target_first": TARGET_FIRST,
                                         "target_noop": TARGET_NOOP, "loadavg": load}, indent=2))


if __name__ == "__main__":
    main()

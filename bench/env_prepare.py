"""The run's environment on a new VM, for the Hugging Face example's requirement set (examples/hf_trainer:
transformers, accelerate and their 29 dependencies beyond the image), on one local VM, in one run:

  pack        glue's prepare (glue.runs.workspace.prepare, over SSH) on a VM without the environment: the
              set's packed virtualenv fetched from the bucket, its sha256 checked, unpacked, its pins checked
  pip         the baseline: `pip install --no-index --find-links <the same wheelhouse, already on the VM's
              disk> --no-deps` of the same pins into a new venv (what a prepare without a pack does after
              fetching the wheels)

Each is run REPEATS times, interleaved; the medians and their ratio are printed. Also: the first prepare
(the wheelhouse install, then the pack stored), the pack unpacked on disk instead of in memory, and the
pack gzip-compressed against uncompressed (how envpack's choice was made). Issue 51's goal: <= 3 s.

    .venv/bin/python bench/env_prepare.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

from recovery import remove_everything, temp_home  # bench/recovery.py
from rich.console import Console

from glue.cluster import current
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.operations import lifecycle
from glue.paths import PROJECT_ROOT
from glue.runs import remote, workspace
from glue.runs.store import RunStore
from glue.train.state_paths import StatePaths
from glue.train.workspace.paths import MEMORY_ROOT, WorkPaths
from glue.workdir import wheelhouse
from glue.workdir.pin import Workspace

GOAL_S = 3.0
RUN = "bench-env"

# On the VM: the baseline, a fresh venv and pip from the wheelhouse folder the first prepare left there.
PIP = """
import json, subprocess, sys, time, venv, shutil, sysconfig
from pathlib import Path
wheels, pins, dest = sys.argv[1], json.loads(sys.argv[2]), Path("/var/lib/gpukit/scratch/bench-pip-venv")
shutil.rmtree(dest, ignore_errors=True)
t0 = time.monotonic()
venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
subprocess.run([sys.executable, "-m", "pip", "--python", str(dest / "bin" / "python"), "install", "--quiet",
                "--disable-pip-version-check", "--no-index", "--find-links", wheels, "--no-deps", "--ignore-installed",
                *pins], check=True)
print(json.dumps({"seconds": time.monotonic() - t0}))
shutil.rmtree(dest)
"""

COPY = "import shutil, sys; shutil.rmtree(sys.argv[2], True); shutil.copytree(sys.argv[1], sys.argv[2]); print('{}')"

# On the VM: glue's prepare with the environment on disk (no memory root), from the spec the controller left.
ON_DISK = """
import json, sys
from pathlib import Path
from glue.train.storage.target import open_bucket
from glue.train.workspace.prepare import prepare
spec = json.loads(Path(sys.argv[1]).read_text())
print(json.dumps(prepare(open_bucket(spec), spec, root=Path("/var/lib/gpukit/work"))["environment"]))
"""

# On the VM: the pack's bytes gzip-compressed (level 1) against not, and unpacking each into memory.
COMPRESSION = """
import gzip, io, json, shutil, sys, tarfile, time
from pathlib import Path
from glue.train.workspace import envpack
env = Path(sys.argv[1]); out = {}
raw, _ = envpack.pack(env)
t0 = time.monotonic(); gz = gzip.compress(raw, compresslevel=1); out["gzip_s"] = time.monotonic() - t0
for name, data, mode in (("none", raw, "r:"), ("gzip", gz, "r:gz")):
    dest = Path("/dev/shm/bench-unpack"); shutil.rmtree(dest, ignore_errors=True); dest.mkdir()
    t0 = time.monotonic()
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
        tar.extractall(dest)
    out[name] = {"bytes": len(data), "unpack_s": time.monotonic() - t0}
    shutil.rmtree(dest)
print(json.dumps(out))
"""


def on_vm(home: Path, host: Host, code: str, *args: str) -> dict[str, Any]:
    cmd = " ".join(shlex.quote(a) for a in (remote.python(host), "-c", code, *args))
    res = ssh.run(home, host, cmd, timeout=1800)
    if res.exit_code != 0:
        raise SystemExit(f"on {host.name}: {res.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def forget_env(home: Path, host: Host, digest: str) -> None:
    """As on a new VM: the set's environment (on disk or in memory) and the run's link to it gone."""
    paths = WorkPaths(RUN, 0)
    gone = [paths.env_dir(digest), MEMORY_ROOT / paths.env_dir(digest).name, paths.run_dir]
    ssh.run(home, host, "rm -rf " + " ".join(shlex.quote(str(p)) for p in gone), timeout=120)


def settle() -> None:
    """The host's disk writes flushed before each measurement (the VMs' disks are this host's): the pack just
    stored, the baseline's venv just written and removed, would otherwise slow the next measurement down (a
    recovery finds the pack stored long before)."""
    os.sync()


def timed_prepare(home: Path, host: Host, store: RunStore, ws: Workspace, attempt: int) -> tuple[float, dict[str, Any]]:
    t0 = time.monotonic()
    ready = workspace.prepare(home, host, store, ws, attempt)
    return time.monotonic() - t0, dict(ready["environment"])


def measure(home: Path, repeats: int) -> dict[str, Any]:
    host = current.host(home, "gpukit-1")
    store = RunStore.open(home, RUN)
    workspace.push_credentials(home, host, store)
    lines = [ln for ln in (PROJECT_ROOT / "examples" / "hf_trainer" / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    req = wheelhouse.pin(store.s3, store.info.name, lines, workspace.target(home, host))
    ws, digest = Workspace(requirements=req), str(req["set_sha256"])
    first_wall, first = timed_prepare(home, host, store, ws, 1)
    wheels = str(WorkPaths(RUN, 1).wheelhouse_dir(digest))
    on_vm(home, host, COPY, wheels, "/var/lib/gpukit/scratch/bench-wheels")
    pack, pip = [], []
    for k in range(repeats):
        forget_env(home, host, digest)
        settle()
        pack.append(timed_prepare(home, host, store, ws, 2 + k))
        settle()
        pip.append(on_vm(home, host, PIP, "/var/lib/gpukit/scratch/bench-wheels", json.dumps(req["pins"]))["seconds"])
    forget_env(home, host, digest)
    spec = StatePaths.of(RUN, 1 + repeats).workspace_spec
    settle()
    disk = on_vm(home, host, ON_DISK, spec)
    comp = on_vm(home, host, COMPRESSION, str(WorkPaths(RUN, 0).env_dir(digest)))
    load = " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {"load": load, "pins": len(req["pins"]), "first_wall": first_wall, "first": first, "pack": pack, "pip": pip,
            "disk": disk, "compression": comp}


def report(m: dict[str, Any]) -> None:
    first, stored = m["first"], m["first"].get("stored", {})
    runs = sorted(m["pack"], key=lambda p: p[1]["seconds"])
    wall, one = runs[len(runs) // 2]  # the median run, with its own breakdown
    best = runs[0][1]["seconds"]
    pip = statistics.median(m["pip"])
    print(f"the HF example's set: {m['pins']} pinned packages; pack {one['bytes'] / 2**20:.0f} MiB, "
          f"{one['files']} files; host load {m['load']}")
    print(f"{'first prepare (wheelhouse install, pack, store)':52} {first['seconds']:7.2f} s  "
          f"(pack {stored.get('pack_s', 0):.2f}, store {stored.get('store_s', 0):.2f}; over SSH {m['first_wall']:.2f})")
    print(f"{'prepare from the pack, on the VM (median)':52} {one['seconds']:7.2f} s  (fetch {one['fetch_s']:.2f}, "
          f"unpack + check {one['unpack_s']:.2f}, in memory: {one['in_memory']}; best {best:.2f}); "
          f"goal <= {GOAL_S:.0f} s")
    print(f"{'  the same, the controller call over SSH':52} {wall:7.2f} s  "
          f"(each: {', '.join(f'{p[0]:.2f}' for p in m['pack'])})")
    print(f"{'pip install --no-index from the same wheelhouse (median)':52} {pip:7.2f} s  "
          f"(each: {', '.join(f'{s:.2f}' for s in m['pip'])})")
    print(f"{'ratio: pip / prepare from the pack (on the VM)':52} {pip / one['seconds']:7.1f}x  "
          f"(over SSH {pip / wall:.1f}x)")
    print(f"{'prepare from the pack, unpacked on disk':52} {m['disk']['seconds']:7.2f} s  (unpack + check "
          f"{m['disk']['unpack_s']:.2f})")
    c = m["compression"]
    print(f"{'compression: none':52} {c['none']['bytes'] / 2**20:7.0f} MiB, unpack {c['none']['unpack_s']:.2f} s")
    print(f"{'compression: gzip level 1':52} {c['gzip']['bytes'] / 2**20:7.0f} MiB, "
          f"unpack {c['gzip']['unpack_s']:.2f} s (+ {c['gzip_s']:.2f} s to compress)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    home = temp_home("gpukit-bench-env-")
    console = Console(stderr=True, quiet=True)
    try:
        lifecycle.up(home, current.ClusterConfig(vms=1), console)
        m = measure(home, args.repeats)
        lifecycle.down(home, console, force=True)
    finally:
        remove_everything(home)
    print(json.dumps(m))
    report(m)


if __name__ == "__main__":
    main()

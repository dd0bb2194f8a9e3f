"""Local VMs (systemd-nspawn machines booted from the baked image): bake, boot, converge.

    .venv/bin/python bench/machines.py [--rounds 3] [--json bench/out/machines.json]

Prints: the image's bake time and size (baked now when the cache lacks it, else as recorded when it
was baked); boot-to-SSH of one VM (median of --rounds) against its floor measured in the same run
(an sshd started straight on this host on the image's config: what booting a machine adds); converge
of 2 fresh VMs and the no-op re-run, as ratios to their goals (<= 10 s and <= 3 s). The overlay-of-
the-host VMs these replaced booted in 0.29 s (bench/qemu.py, before they were removed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.cloud.local.bucket import free_port
from glue.cloud.local.nspawn import ssh_banner
from glue.images import build, recipe
from glue.infra import ansible
from glue.paths import PROJECT_ROOT
from tests.testbed import LocalTestbed

GOAL_FIRST, GOAL_NOOP = 10.0, 3.0


def _bed(tmp: Path) -> LocalTestbed:
    return LocalTestbed(tmp / f"machine-{time.monotonic_ns()}")


def _cleanup(bed: LocalTestbed) -> None:
    for vm_id in bed.backend.owned_vm_ids():
        bed.backend.delete_vm(vm_id)
    bed.backend.bucket_server.stop()


def sshd_floor_seconds(tmp: Path, rounds: int) -> float:
    """An sshd started on this host (its own host key, loopback port) until it answers: the floor."""
    times = []
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir (made by its service)
    for i in range(rounds):
        key = tmp / f"floor-key-{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        port = free_port()
        t = time.monotonic()
        proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", "/dev/null", "-h", str(key),
                                 "-o", f"ListenAddress=127.0.0.1:{port}"], stdin=subprocess.DEVNULL)
        try:
            while not ssh_banner(port):
                if proc.poll() is not None:
                    raise SystemExit(f"sshd exited {proc.returncode} before answering (see its stderr above)")
                time.sleep(0.005)
            times.append(time.monotonic() - t)
        finally:
            proc.kill()
            proc.wait()
    return statistics.median(times)


def boot_seconds(tmp: Path, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        bed = _bed(tmp)
        try:
            bed.backend.bucket()  # the bucket starts outside the timing
            t = time.monotonic()
            bed.create(1)
            times.append(time.monotonic() - t)
        finally:
            _cleanup(bed)
    return statistics.median(times)


def converge_seconds(tmp: Path) -> tuple[float, float]:
    bed = _bed(tmp)
    try:
        bed.create(2)
        t = time.monotonic()
        first = ansible.converge(bed.home, progress=False)
        t_first = time.monotonic() - t
        t = time.monotonic()
        second = ansible.converge(bed.home, progress=False)
        t_noop = time.monotonic() - t
        assert first.ok and second.ok, (first.failed, second.failed)
        assert set(second.changed.values()) == {0}, second.changed
        return t_first, t_noop
    finally:
        _cleanup(bed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("GPUKIT_IMAGES", str(PROJECT_ROOT / ".gpukit" / "images"))
    with tempfile.TemporaryDirectory(prefix="bench-machines-") as tmpdir:
        tmp = Path(tmpdir)
        image, baked = build.build(recipe.load("gpukit"), tmp)
        out: dict[str, object] = {
            "image": {"size_mb": round(image.size_bytes / 1e6), "bake_s": image.build_seconds, "baked_now": baked},
            "boot_to_ssh_s": round(boot_seconds(tmp, args.rounds), 2),
            "sshd_floor_s": round(sshd_floor_seconds(tmp, args.rounds), 3),
        }
        first, noop = converge_seconds(tmp)
        out["converge_2_fresh_s"], out["converge_noop_s"] = round(first, 1), round(noop, 1)
    print(f"image: {out['image']}")
    boot, floor = float(str(out["boot_to_ssh_s"])), float(str(out["sshd_floor_s"]))
    print(f"boot to SSH: machine {boot} s, sshd alone {floor} s (ratio {boot / max(floor, 1e-3):.1f})")
    for what, goal in (("converge_2_fresh_s", GOAL_FIRST), ("converge_noop_s", GOAL_NOOP)):
        v = float(str(out[what]))
        print(f"{what}: {v} s (goal <= {goal} s: ratio {v / goal:.2f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

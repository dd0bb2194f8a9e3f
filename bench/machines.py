"""Local VMs booted from the baked image (systemd-nspawn machines) against the overlay-of-the-host VMs,
measured in the same run.

    .venv/bin/python bench/machines.py [--rounds 3] [--json bench/out/machines.json]

Prints: the image's bake time and size (baked now when the cache lacks it, else as recorded when it
was baked); boot-to-SSH of one VM of each kind (median of --rounds); converge of 2 fresh VMs and the
no-op re-run for each kind (goals for machines: <= 10 s and <= 3 s). Ratios are machine / overlay.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.images import build, recipe
from glue.infra import ansible
from glue.paths import PROJECT_ROOT
from tests.testbed import LocalTestbed

GOAL_FIRST, GOAL_NOOP = 10.0, 3.0


def _bed(kind: str, tmp: Path) -> LocalTestbed:
    os.environ["GPUKIT_LOCAL_VMS"] = kind  # read when the testbed picks its backend
    return LocalTestbed(tmp / f"{kind}-{time.monotonic_ns()}")


def _cleanup(bed: LocalTestbed) -> None:
    for vm_id in bed.backend.owned_vm_ids():
        bed.backend.delete_vm(vm_id)
    bed.backend.bucket_server.stop()


def boot_seconds(kind: str, tmp: Path, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        bed = _bed(kind, tmp)
        try:
            bed.backend.bucket()  # the bucket starts outside the timing
            t = time.monotonic()
            bed.create(1)
            times.append(time.monotonic() - t)
        finally:
            _cleanup(bed)
    return statistics.median(times)


def converge_seconds(kind: str, tmp: Path) -> tuple[float, float]:
    bed = _bed(kind, tmp)
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
            "boot_to_ssh_s": {k: round(boot_seconds(k, tmp, args.rounds), 2) for k in ("overlay", "machine")},
        }
        conv = {k: converge_seconds(k, tmp) for k in ("overlay", "machine")}
        out["converge_2_fresh_s"] = {k: round(v[0], 1) for k, v in conv.items()}
        out["converge_noop_s"] = {k: round(v[1], 1) for k, v in conv.items()}
    boot = out["boot_to_ssh_s"]
    assert isinstance(boot, dict)
    print(f"image: {out['image']}")
    print(f"boot to SSH: machine {boot['machine']} s, overlay {boot['overlay']} s "
          f"(ratio {boot['machine'] / boot['overlay']:.2f})")
    for what, goal in (("converge_2_fresh_s", GOAL_FIRST), ("converge_noop_s", GOAL_NOOP)):
        v = out[what]
        assert isinstance(v, dict)
        print(f"{what}: machine {v['machine']} s (goal <= {goal} s: {v['machine'] / goal:.2f}), "
              f"overlay {v['overlay']} s (ratio {v['machine'] / v['overlay']:.2f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""A recovery's validate: finding the newest valid checkpoint from the controller, deep (every object read
back and its sha256 compared), over the local bucket (`rclone serve s3` on loopback, boto3), in one run:

  newest first   glue's validate since 2026-12-07 (glue.train.checkpoint.format.newest_valid): the newest
                 checkpoint checked, an older one only when every newer one is invalid
  all            the baseline, what it did before: every retained checkpoint checked, then the newest valid

A run of the model with --size-mb of weights saves --keep checkpoints; each is timed REPEATS times,
interleaved; the medians and their ratio are printed.

    .venv/bin/python bench/validate.py [--size-mb 64] [--keep 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from glue.cloud.local.bucket import LocalBucket
from glue.train import Checkpointer
from glue.train.checkpoint.format import check_checkpoints, newest_valid
from glue.train.storage.target import Storage, open_target


def _timed(fn: Callable[[], int | None]) -> tuple[float, int | None]:
    t0 = time.perf_counter()
    found = fn()
    return time.perf_counter() - t0, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-validate-"))
    bucket = LocalBucket(home)
    info = bucket.ensure_running()
    creds = bucket.credentials()
    try:
        target = f"s3://{info.name}/bench-validate"
        kw = {"endpoint_url": info.endpoint, "region": info.signing_region, "credentials": lambda: creds}
        width = args.size_mb * 2**20 // 4 // 1024
        with Checkpointer(target, handle_sigterm=False, keep_last=args.keep, **kw) as ck:  # type: ignore[arg-type]
            ck.register("model", torch.nn.Linear(1024, width, bias=False))
            for step in range(1, args.keep + 1):
                ck.save(step)
        storage: Storage = open_target(target, **kw)  # type: ignore[arg-type]

        def every() -> int | None:
            return max((s.step for s in check_checkpoints(storage, deep=True) if s.valid), default=None)

        def newest() -> int | None:
            found = newest_valid(storage, deep=True)
            return found.step if found is not None else None

        times: dict[str, list[float]] = {"newest first": [], "all": []}
        for _ in range(args.repeats):
            for name, fn in (("newest first", newest), ("all", every)):
                took, found = _timed(fn)
                assert found == args.keep, f"{name} found checkpoint {found}, not {args.keep}"
                times[name].append(took)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{args.keep} checkpoints of {args.size_mb} MiB, deep, over the local bucket, medians of {args.repeats}:")
        for name, value in med.items():
            print(f"  {name:13s} {value:.3f} s")
        print(f"  ratio         {med['newest first'] / med['all']:.2f}x")
    finally:
        bucket.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

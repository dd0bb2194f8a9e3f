"""A deployed run's checkpoint target under the bucket mount is committed in the bucket itself.

The mount's write-back cache acknowledges writes the bucket does not have yet. Here the "mount" is a
plain directory standing in for /mnt/s3 (GPUKIT_BUCKET_MOUNT): whatever lands in it is the VM's cache,
lost with the VM. Every commit must be in the real (rclone-served) bucket before save returns.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.train import TrainState, layout, validate_checkpoints
from glue.train.run.context import RunContext
from glue.train.storage.mount import bucket_url


def _env(bucket: Any, tmp_path: Path, run: str) -> dict[str, str]:
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"access_key": bucket.creds.access_key, "secret_key": bucket.creds.secret_key}))
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    return {
        "GPUKIT_RUN": run,
        "GPUKIT_CHECKPOINT": f"{mnt}/{layout.RUNS_PREFIX}{run}",
        "GPUKIT_BUCKET_MOUNT": str(mnt),
        "GPUKIT_OUTPUTS": f"{mnt}/{layout.run_prefix(run)}{layout.OUTPUTS}",
        "GPUKIT_BUCKET_NAME": bucket.info.name,
        "GPUKIT_BUCKET_ENDPOINT": bucket.info.endpoint,
        "GPUKIT_CREDENTIALS_FILE": str(creds),
        "GPUKIT_HEARTBEAT_SECONDS": "60",
    }


@pytest.mark.timeout(120)
def test_commits_through_the_mount_are_in_the_bucket_when_the_mount_dies(local_bucket: Any, tmp_path: Path) -> None:
    run = f"mnt-{uuid.uuid4().hex[:8]}"
    env = _env(local_bucket, tmp_path, run)
    model = torch.nn.Linear(3, 2)
    with RunContext(env) as ctx:
        ck = ctx.checkpointer(handle_sigterm=False)
        ck.register("model", model)
        ck.register("train", TrainState())
        for step in (1, 2, 3):
            ck.save(step, blocking=True)
        ctx.write_output("result.txt", b"done")
        ck.close()
    cached = [p for p in (tmp_path / "mnt").rglob("*") if p.is_file()]
    shutil.rmtree(tmp_path / "mnt")  # the mount dies with its write cache
    assert cached == [], "checkpoint or output bytes went through the mount's cache"
    url = layout.run_uri(local_bucket.info.name, run)
    kw = {"endpoint_url": local_bucket.info.endpoint, "credentials": lambda: local_bucket.creds}
    valid = [s.step for s in validate_checkpoints(url, **kw) if s.valid]
    assert valid == [3, 2], "the newest commit and the previous checkpoint are valid in the bucket itself"
    key = f"{layout.run_prefix(run)}{layout.OUTPUTS}/result.txt"
    obj = local_bucket.client().get_object(Bucket=local_bucket.info.name, Key=key)
    assert obj["Body"].read() == b"done"

    with RunContext(_env(local_bucket, tmp_path, run)) as ctx:  # a new VM, its mount empty
        fresh = torch.nn.Linear(3, 2)
        ck = ctx.checkpointer(handle_sigterm=False)
        ck.register("model", fresh)
        ck.register("train", TrainState())
        assert ck.restore() == 3
        ck.close()
    assert torch.equal(fresh.weight, model.weight)


def test_bucket_url_maps_only_paths_under_the_mount() -> None:
    run = layout.RUNS_PREFIX + "r1"
    assert bucket_url(f"/mnt/s3/{run}", "b") == layout.run_uri("b", "r1")
    assert bucket_url(f"/mnt/s3/{layout.RUNS_PREFIX}../{run}/", "b") == layout.run_uri("b", "r1")
    assert bucket_url("/mnt/s3", "b") == "s3://b"
    assert bucket_url(f"/mnt/s3x/{run}", "b") is None
    assert bucket_url("/data/ckpt", "b") is None
    assert bucket_url(layout.run_uri("b", "r1"), "b") is None

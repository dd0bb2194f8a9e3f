"""A standalone Checkpointer("/mnt/s3/...") (no RunContext) commits in the bucket, not the mount's cache.

The VM's kit mount leaves its settings (mount.conf) and the rclone config with the bucket's endpoint and
credentials. Here they point at the real rclone S3 server, and the "mount" is a plain directory: every
object must land in the bucket through the S3 API, and nothing in the directory.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import torch

from glue.train import Checkpointer, TrainState, layout
from glue.train.storage.mount_config import mounted_bucket, resolve
from tests.conftest import BucketHandle


def _kit_mount(tmp_path: Path, bucket: BucketHandle) -> tuple[Path, Path]:
    mnt = tmp_path / "mnt-s3"
    mnt.mkdir()
    rclone = tmp_path / "rclone.conf"
    rclone.write_text(
        "[gpukit]\ntype = s3\nprovider = Other\nenv_auth = false\n"
        f"access_key_id = {bucket.creds.access_key}\nsecret_access_key = {bucket.creds.secret_key}\n"
        f"endpoint = {bucket.info.endpoint}\nregion = us-east-1\nforce_path_style = true\n")
    rclone.chmod(0o600)
    settings = tmp_path / "mount.conf"
    settings.write_text(f"# bucket_mount\nRCLONE_CONFIG='{rclone}'\nREMOTE='gpukit:{bucket.info.name}'\n"
                        f"MNT='{mnt}'\nCACHE_DIR=/var/cache/x\n")
    return mnt, settings


def test_checkpoints_under_the_mount_go_to_the_bucket(tmp_path: Path, local_bucket: BucketHandle,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    mnt, settings = _kit_mount(tmp_path, local_bucket)
    monkeypatch.setenv("GPUKIT_MOUNT_CONFIG", str(settings))
    mb = mounted_bucket()
    assert mb is not None and mb.bucket == local_bucket.info.name and mb.mount == str(mnt)
    assert local_bucket.creds.secret_key not in repr(mb.credentials())
    prefix = f"standalone-{uuid.uuid4().hex[:8]}"
    ts = TrainState()
    model = torch.nn.Linear(4, 2)
    with Checkpointer(mnt / prefix, keep_last=2, components={"model": model, "train": ts}) as ck:
        for step in (1, 2, 3):
            ts.step = step
            ck.save(step, blocking=True)
        assert ck.latest_valid() == 3
    assert not any(mnt.iterdir()), "nothing may be written through the mount path"
    keys = [o["Key"] for o in local_bucket.client().list_objects_v2(
        Bucket=local_bucket.info.name, Prefix=prefix)["Contents"]]
    assert f"{prefix}/{layout.commit_key(3)}" in keys and f"{prefix}/{layout.commit_key(2)}" in keys
    assert not any("/step-1/" in k for k in keys), "pruned in the bucket, after step 3 was verified there"


def test_without_readable_settings_the_mount_path_is_kept_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_MOUNT_CONFIG", str(tmp_path / "absent.conf"))
    assert mounted_bucket() is None
    target = tmp_path / "plain"
    with caplog.at_level(logging.WARNING, logger="glue.train"):
        with Checkpointer(target, components={"train": TrainState()}) as ck:
            ck.save(1, blocking=True)
    assert (target / layout.commit_key(1)).exists()
    assert not any("under /mnt/s3" in r.message for r in caplog.records)  # not a mount path: no warning
    with caplog.at_level(logging.WARNING, logger="glue.train"):
        assert resolve(f"/mnt/s3/{layout.RUNS_PREFIX}x", None) == (f"/mnt/s3/{layout.RUNS_PREFIX}x", None, None, None)
    assert any("judged by the mount's write cache" in r.message for r in caplog.records)

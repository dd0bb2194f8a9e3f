"""Sealed framework checkpoints (glue.train.checkpoint.sealed) on a folder target: what a seal writes,
what fetch brings back and skips, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glue.train import layout
from glue.train.checkpoint.sealed import FolderCheckpoints
from glue.train.errors import CheckpointError, SaveFailedError
from glue.train.storage.folder import FileStorage
from glue.train.storage.retry import RetryPolicy


def _folder(root: Path, step: int) -> Path:
    src = root / f"checkpoint-{step}"
    (src / "nested").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(bytes(range(256)) * step)
    (src / "nested" / "rng_state.pth").write_bytes(b"rng %d" % step)
    return src


def test_sealed_folders_come_back_whole_and_keep_last_prunes(tmp_path: Path) -> None:
    sealed = FolderCheckpoints(tmp_path / "bucket", keep_last=2)
    for step in (4, 8, 12):
        sealed.seal_async(step, _folder(tmp_path / "vm1", step))
    sealed.close()  # waits for the last one
    assert sorted(p.name for p in (tmp_path / "bucket" / "ckpt").iterdir()) == ["step-12", "step-8"]
    commit = json.loads((tmp_path / "bucket" / layout.commit_key(12)).read_text())
    assert sorted(o["key"] for o in commit["components"]["files"]) == [
        "files/model.safetensors", "files/nested/rng_state.pth", "folder.json"]
    got = FolderCheckpoints(tmp_path / "bucket").fetch(tmp_path / "vm2")
    assert got is not None and got.step == 12 and got.path == tmp_path / "vm2" / "checkpoint-12"
    for rel in ("model.safetensors", "nested/rng_state.pth"):
        assert (got.path / rel).read_bytes() == (tmp_path / "vm1" / "checkpoint-12" / rel).read_bytes()


def test_a_single_file_checkpoint_and_a_missing_one(tmp_path: Path) -> None:
    sealed = FolderCheckpoints(tmp_path / "bucket")
    ckpt = tmp_path / "epoch=0-step=5.ckpt"
    ckpt.write_bytes(b"lightning")
    sealed.seal(5, ckpt)
    got = sealed.fetch(tmp_path / "new")
    assert got is not None and got.path == tmp_path / "new" / "epoch=0-step=5.ckpt"
    assert got.path.read_bytes() == b"lightning"
    with pytest.raises(CheckpointError, match=r"^nothing to seal at .*nope: no such file or folder$"):
        sealed.seal(6, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"the folder is empty$"):
        sealed.seal(6, tmp_path / "empty")
    assert FolderCheckpoints(tmp_path / "other").fetch(tmp_path / "x") is None
    sealed.close()


def test_a_failed_background_seal_is_raised_by_the_next_one(tmp_path: Path) -> None:
    once = RetryPolicy(attempts=1, base_s=0.01, max_s=0.01, deadline_s=1)  # fail at once, no backoff
    sealed = FolderCheckpoints(tmp_path / "bucket", storage=FileStorage(tmp_path / "bucket", retry=once))
    src = _folder(tmp_path, 3)
    sealed.seal_async(3, src)
    sealed.flush()
    blocker = tmp_path / "bucket" / "ckpt" / "step-7"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the step folder goes")  # every put under step-7 fails
    sealed.seal_async(7, src)
    with pytest.raises(SaveFailedError, match=r"^checkpoint of step 7 failed and was not committed"):
        sealed.seal_async(8, src)
    sealed.close()

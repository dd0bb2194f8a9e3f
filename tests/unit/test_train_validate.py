"""Deep validation downloads objects concurrently but reports as if it read them one by one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from glue.train import Checkpointer, TrainState, layout
from glue.train.checkpoint.format import list_steps, validate_step
from glue.train.storage.folder import FileStorage


class SlowFirst(FileStorage):
    """Reads of `slow` take a while, so the objects after it finish downloading first."""

    def __init__(self, root: Path, slow: str) -> None:
        super().__init__(root)
        self.slow = slow
        self.reads: list[str] = []

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        self.reads.append(key)
        if key.endswith(self.slow):
            time.sleep(0.5)
        return super().get(key, size_hint)


def _flip(path: Path) -> None:
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 1
    path.write_bytes(bytes(body))


def test_the_first_bad_object_in_commit_order_is_reported(tmp_path: Path) -> None:
    with Checkpointer(str(tmp_path), handle_sigterm=False) as ck:
        ck.register("model", torch.nn.Linear(64, 64))
        ck.register("optimizer", torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
        ck.register("train", TrainState())
        ck.save(1)
    step = tmp_path / "ckpt" / "step-1"
    fs = FileStorage(tmp_path)
    commit = validate_step(fs, 1, list_steps(fs)[1]).commit
    assert commit is not None
    keys = [ref.key for ref in commit.objects()]
    first = keys[0]
    for key in keys:
        _flip(step / key)  # every object is corrupt; the later ones are read back sooner
    st = SlowFirst(tmp_path, slow=first)
    status = validate_step(st, 1, list_steps(st)[1], deep=True)
    assert not status.valid
    assert [p.object for p in status.problems] == [layout.step_prefix(1) + first]
    assert "sha256" in status.problems[0].what
    assert len(st.reads) <= 1 + 2, "a problem stops the reads that have not started"  # COMMIT.json + 2 at once


def test_a_valid_step_keeps_what_restore_asks_for(tmp_path: Path) -> None:
    with Checkpointer(str(tmp_path), handle_sigterm=False) as ck:
        ck.register("model", torch.nn.Linear(64, 64))
        ck.register("train", TrainState())
        ck.save(3)
    st = SlowFirst(tmp_path, slow="model.pt")
    blobs: dict[str, bytearray] = {}
    status = validate_step(st, 3, list_steps(st)[3], deep=True, keep=lambda r: r.key == "train.pt", blobs=blobs)
    assert status.valid and set(blobs) == {"train.pt"}
    assert status.bytes == sum(r.size for r in status.commit.objects())  # type: ignore[union-attr]
    assert 0.5 <= status.download_s < 2


class Counting(FileStorage):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        self.reads.append(key)
        return super().get(key, size_hint)


def test_the_newest_valid_checkpoint_is_found_without_reading_the_older_ones(tmp_path: Path) -> None:
    """A recovery's validate (glue.runs.monitor.last_valid_checkpoint, deep) reads only what it resumes from:
    each deep check reads a whole checkpoint, and a run keeps several."""
    from glue.train.checkpoint.format import newest_valid

    with Checkpointer(str(tmp_path), handle_sigterm=False, keep_last=3) as ck:
        ck.register("model", torch.nn.Linear(64, 64))
        ck.register("train", TrainState())
        for step in (1, 2, 3):
            ck.save(step)
    fs = Counting(tmp_path)
    found = newest_valid(fs, deep=True)
    assert found is not None and found.step == 3
    assert fs.reads and all(k.startswith(layout.step_prefix(3)) for k in fs.reads), fs.reads
    # The newest corrupt: the one before it, and never the oldest.
    for key in [r.key for r in found.commit.objects()] if found.commit else []:
        _flip(tmp_path / "ckpt" / "step-3" / key)
    fs = Counting(tmp_path)
    found = newest_valid(fs, deep=True)
    assert found is not None and found.step == 2
    assert not any(k.startswith(layout.step_prefix(1)) for k in fs.reads), fs.reads


def test_a_recoverys_validate_reads_only_the_checkpoint_it_resumes_from(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from glue.runs import monitor

    with Checkpointer(str(tmp_path), handle_sigterm=False, keep_last=3) as ck:
        ck.register("model", torch.nn.Linear(64, 64))
        for step in (1, 2, 3):
            ck.save(step)
    fs = Counting(tmp_path)
    monkeypatch.setattr(monitor, "checkpoint_storage", lambda store, manifest: fs)
    assert monitor.last_valid_checkpoint(None, None, deep=True) == 3  # type: ignore[arg-type]
    assert all(k.startswith(layout.step_prefix(3)) for k in fs.reads), fs.reads

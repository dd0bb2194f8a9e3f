"""Fencing closes the race the store cannot: a commit written just after a newer attempt was recorded
(the trainer paused between its check and its write) is taken back, and the trainer stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from glue.train import layout
from glue.train.checkpoint.fence import FencedError, FencedStorage
from glue.train.storage.folder import FileStorage

COMMIT_KEY = layout.commit_key(3)


class RecoveryLandsDuringTheWrite(FileStorage):
    """The checkpoint store; recovery records attempt 2 right as this COMMIT.json goes out."""

    def __init__(self, root: Path, run_store: FileStorage) -> None:
        super().__init__(root)
        self.run_store = run_store

    def put(self, key: str, data: bytes | bytearray) -> None:
        if key.endswith(layout.COMMIT):
            self.run_store.put(layout.attempt_key(2), b'{"attempt": 2}')
        super().put(key, data)


def _stores(tmp_path: Path) -> tuple[FileStorage, Path]:
    run_store = FileStorage(tmp_path / "run")
    run_store.put(layout.attempt_key(1), b'{"attempt": 1}')
    return run_store, tmp_path / "ckpt"


def test_a_commit_that_raced_the_new_attempt_is_taken_back(tmp_path: Path) -> None:
    run_store, ckpt_root = _stores(tmp_path)
    inner = RecoveryLandsDuringTheWrite(ckpt_root, run_store)
    fenced = FencedStorage(inner, run_store, "r1", 1)
    fenced.put(layout.step_prefix(3) + "model.pt", b"weights")
    with pytest.raises(FencedError, match=r"attempt 2 of run r1 has replaced.*took back the commit"):
        fenced.put(COMMIT_KEY, b"{}")
    assert not (ckpt_root / COMMIT_KEY).exists()
    assert (ckpt_root / (layout.step_prefix(3) + "model.pt")).read_bytes() == b"weights"  # nothing else removed
    with pytest.raises(FencedError, match="not committing"):
        fenced.put(layout.commit_key(4), b"{}")


def test_the_current_attempt_commits(tmp_path: Path) -> None:
    run_store, ckpt_root = _stores(tmp_path)
    fenced = FencedStorage(FileStorage(ckpt_root), run_store, "r1", 1)
    fenced.put(COMMIT_KEY, b"{}")
    assert (ckpt_root / COMMIT_KEY).read_bytes() == b"{}"

"""The wheel cache key: the same code gives the same hash, any change to it a new one."""

from __future__ import annotations

import os
from pathlib import Path

from glue.infra.source_hash import WHEEL_DIRS_KEPT, prune_wheel_dirs, source_hash


def _tree(root: Path) -> None:
    (root / "glue" / "train").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'gpukit'\n")
    (root / "glue" / "__init__.py").write_text("")
    (root / "glue" / "train" / "loop.py").write_text("STEP = 1\n")


def test_the_hash_follows_the_code_and_ignores_bytecode(tmp_path: Path) -> None:
    _tree(tmp_path)
    first = source_hash(tmp_path)
    assert source_hash(tmp_path) == first
    (tmp_path / "glue" / "__pycache__").mkdir()
    (tmp_path / "glue" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert source_hash(tmp_path) == first
    (tmp_path / "glue" / "train" / "loop.py").write_text("STEP = 2\n")
    changed = source_hash(tmp_path)
    assert changed != first
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'gpukit'\nversion = '2'\n")
    assert source_hash(tmp_path) not in (first, changed)


def test_a_renamed_file_changes_the_hash(tmp_path: Path) -> None:
    _tree(tmp_path)
    before = source_hash(tmp_path)
    (tmp_path / "glue" / "train" / "loop.py").rename(tmp_path / "glue" / "train" / "step.py")
    assert source_hash(tmp_path) != before


def test_pruning_keeps_the_current_and_the_newest_wheel_dirs(tmp_path: Path) -> None:
    names = [f"h{i}" for i in range(WHEEL_DIRS_KEPT + 3)]
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    prune_wheel_dirs(tmp_path, keep="h0")  # the oldest, but the one in use
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "h0" in left
    assert len(left) == WHEEL_DIRS_KEPT
    assert names[-1] in left and names[1] not in left

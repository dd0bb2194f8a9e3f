"""No silent restart from zero: committed checkpoints that are all invalid stop restore, and are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glue.train import NoValidCheckpointError
from tests.unit.test_train_checkpoint import Model, _ck, _steps


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _damaged(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        for s in (1, 2):
            ck.save(m.at(s).train.step, blocking=True)
    (tmp_path / "ckpt" / "step-2" / "model.pt").write_bytes(b"garbage")  # size and sha256 wrong
    obj = tmp_path / "ckpt" / "step-1" / "train.pt"
    body = bytearray(obj.read_bytes())
    body[len(body) // 2] ^= 0x40  # same size, bit flipped
    obj.write_bytes(bytes(body))


def test_all_committed_checkpoints_invalid_raises_and_deletes_nothing(tmp_path: Path) -> None:
    _damaged(tmp_path)
    before = _files(tmp_path / "ckpt")
    with Model().register(_ck(tmp_path)) as ck:
        with pytest.raises(NoValidCheckpointError) as err:
            ck.restore()
        with pytest.raises(NoValidCheckpointError):
            ck.restore()  # the README loop restarted by a supervisor fails again: no step-0 save ever prunes
    msg = str(err.value)
    assert "\n" not in msg and "step 2: size" in msg and "step 1: sha256" in msg and "start_fresh=True" in msg
    assert _files(tmp_path / "ckpt") == before
    classes = {json.loads(p.read_text())["class"] for p in (tmp_path / "incidents").iterdir()}
    assert classes == {"ckpt_corrupt"}


def test_start_fresh_moves_invalid_ones_aside_for_inspection(tmp_path: Path) -> None:
    _damaged(tmp_path)
    before = _files(tmp_path / "ckpt")
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        assert ck.restore(start_fresh=True) is None
        for s in (1, 2, 3):
            ck.save(m.at(s).train.step, blocking=True)
    assert _steps(tmp_path) == [2, 3]
    (stamp,) = (tmp_path / "ckpt-invalid").iterdir()
    kept = {k: v for k, v in _files(stamp).items()}
    assert kept == before, "every damaged object is kept byte for byte"


def test_interrupted_saves_alone_start_fresh(tmp_path: Path) -> None:
    """A first save killed before COMMIT.json is routine, not a reason to refuse to start."""
    partial = tmp_path / "ckpt" / "step-5"
    partial.mkdir(parents=True)
    (partial / "model.pt").write_bytes(b"half")
    with Model().register(_ck(tmp_path)) as ck:
        assert ck.restore() is None
    (incident,) = [json.loads(p.read_text()) for p in (tmp_path / "incidents").iterdir()]
    assert incident["class"] == "ckpt_interrupted" and incident["step"] == 5


def test_prune_moves_a_committed_checkpoint_gone_bad_aside_instead_of_deleting_it(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path, keep_last=2)) as ck:
        for s in (1, 2):
            ck.save(m.at(s).train.step, blocking=True)
        bad = (tmp_path / "ckpt" / "step-1" / "model.pt").read_bytes()
        (tmp_path / "ckpt" / "step-1" / "model.pt").write_bytes(bad + b"x")  # damaged after its commit
        ck.save(m.at(3).train.step, blocking=True)  # prunes: step 1 is past keep_last and invalid
    assert _steps(tmp_path) == [2, 3]
    kept = list((tmp_path / "ckpt-invalid").rglob("step-1/model.pt"))
    assert len(kept) == 1 and kept[0].read_bytes() == bad + b"x"

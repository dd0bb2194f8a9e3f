"""The resume check's window: exact on every compared step, and fair to a rank whose VM took its tail."""

from __future__ import annotations

from typing import Any

from glue.recovery.resume_check import check_resume, rank_upto


def _steps(lo: int, hi: int, shift: float = 0.0) -> dict[int, dict[str, Any]]:
    return {s: {"step": s, "loss": 1.0 / s + shift} for s in range(lo, hi + 1)}


def test_a_rank_that_lost_its_tail_is_compared_up_to_its_own_last_step() -> None:
    before = _steps(1, 23)  # rank 1 shipped steps up to 23; rank 0 reached 27 before the VM went
    assert rank_upto(before, upto=27, ckpt=20) == 23
    assert check_resume(before, _steps(21, 30), 20, rank_upto(before, 27, 20), 0.0).compared == [21, 22, 23]
    assert rank_upto({}, upto=27, ckpt=20) == 20  # nothing recorded after the checkpoint: first step only
    assert rank_upto(_steps(1, 30), upto=27, ckpt=20) == 27  # never past rank 0's reach


def test_a_differing_or_missing_step_inside_the_window_still_fails() -> None:
    before = _steps(1, 25)
    bad = {**_steps(21, 30), 22: {"step": 22, "loss": 9.0}}
    res = check_resume(before, bad, 20, rank_upto(before, 27, 20), 0.0)
    assert not res.ok and "loss at step 22" in (res.problem or "")
    gap = {s: r for s, r in _steps(21, 30).items() if s != 24}
    res = check_resume(before, gap, 20, rank_upto(before, 27, 20), 0.0)
    assert not res.ok and "24 missing from the resumed run" in (res.problem or "")

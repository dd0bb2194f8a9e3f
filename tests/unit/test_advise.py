import math

import pytest

from glue.operations.recovery import advise
from glue.operations.recovery.resume_check import check_resume


def test_young_and_daly() -> None:
    c, m = 30.0, 86400.0
    assert advise.young(c, m) == pytest.approx(math.sqrt(2 * 30 * 86400))
    # Daly's correction is small when C << M and grows as C approaches M.
    assert abs(advise.daly(c, m) - advise.young(c, m)) / advise.young(c, m) < 0.01
    assert advise.daly(600, 3600) != pytest.approx(advise.young(600, 3600), rel=0.01)
    assert advise.daly(10_000, 3600) == 3600  # C >= 2M: checkpoint every MTBF


def test_worked_example_is_ten_minutes() -> None:
    lines = "\n".join(advise.worked_example())
    assert "minute 95" in lines and "5 + 5 = 10 minutes" in lines


def test_expected_loss_and_overhead() -> None:
    assert advise.expected_loss(600, 300) == 600  # half of 10 min replay + 5 min restore
    assert advise.overhead(600, 6, 300, 86400) == pytest.approx(6 / 600 + 600 / 86400)


def rec(loss: float, **kw: str) -> dict:
    return {"loss": loss, **kw}


def test_resume_check_exact_match() -> None:
    old = {s: rec(1.0 / s) for s in range(1, 38)}
    new = {s: rec(1.0 / s) for s in range(21, 45)}
    res = check_resume(old, new, ckpt=20, upto=37, tolerance=0.0)
    assert res.ok and res.first_step == 21 and res.compared == list(range(21, 38))


def test_resume_check_wrong_first_step() -> None:
    res = check_resume({}, {s: rec(1.0) for s in range(1, 5)}, ckpt=20, upto=25, tolerance=0.0)
    assert not res.ok and "first resumed step 1 != checkpoint step 20 + 1" in (res.problem or "")


def test_resume_check_names_lost_data_position() -> None:
    old = {21: rec(2.0, data="0:160", batch="aa", rng="r1"), 22: rec(1.9, data="0:168", batch="bb", rng="r2")}
    new = {21: rec(2.1, data="0:0", batch="zz", rng="r1"), 22: rec(1.8, data="0:8", batch="yy", rng="r2")}
    res = check_resume(old, new, ckpt=20, upto=22, tolerance=0.0)
    assert not res.ok and "step 21" in (res.problem or "") and "data position" in (res.problem or "")
    differ = (res.problem or "").split("differ:")[1]
    assert "rng" not in differ and "worker" not in differ


def test_resume_check_names_lost_worker_randomness() -> None:
    old = {21: rec(2.0, data="0:160", batch="aa", rng="r1")}
    new = {21: rec(2.1, data="0:160", batch="zz", rng="r1")}  # same samples, other contents
    res = check_resume(old, new, ckpt=20, upto=21, tolerance=0.0)
    assert not res.ok and "worker RNG" in (res.problem or "") and "data position" not in (res.problem or "")


def test_resume_check_tolerance() -> None:
    old = {21: rec(2.0)}
    assert check_resume(old, {21: rec(2.0005)}, 20, 21, tolerance=1e-3).ok
    assert not check_resume(old, {21: rec(2.0005)}, 20, 21, tolerance=0.0).ok


def test_resume_with_no_steps_passes_only_after_finished_training() -> None:
    old = {s: rec(1.0 / s) for s in range(1, 41)}  # the lost attempt reached step 40 and saved it
    # It had written its outputs: the VM died between the end of training and the exit.
    assert check_resume(old, {}, ckpt=40, upto=40, tolerance=0.0, finished_before=True).ok
    # No outputs: a resume that trains nothing skipped the rest of the run.
    assert "reported no steps" in (check_resume(old, {}, 40, 40, 0.0, finished_before=False).problem or "")
    # Outputs, but the checkpoint is behind the last step reached: steps were skipped.
    assert not check_resume(old, {}, ckpt=30, upto=40, tolerance=0.0, finished_before=True).ok


def test_resume_check_fails_on_a_step_missing_from_either_run() -> None:
    old = {s: rec(1.0 / s) for s in range(1, 38)}
    new = {s: rec(1.0 / s) for s in range(21, 45)}
    del new[30]
    res = check_resume(old, new, ckpt=20, upto=37, tolerance=0.0)
    assert not res.ok and "30 missing from the resumed run" in (res.problem or "")
    new[30] = rec(1.0 / 30)
    del old[25]
    res = check_resume(old, new, ckpt=20, upto=37, tolerance=0.0)
    assert not res.ok and "25 missing from the run before the failure" in (res.problem or "")


def test_resume_check_compares_nothing_only_when_the_failure_was_at_the_checkpoint() -> None:
    old = {s: rec(1.0 / s) for s in range(1, 41)}
    new = {s: rec(1.0 / s) for s in range(41, 46)}
    res = check_resume(old, new, ckpt=40, upto=40, tolerance=0.0)  # died right after saving step 40
    assert res.ok and res.compared == [] and res.first_step == 41
    res = check_resume({s: rec(1.0) for s in range(1, 31)}, new, ckpt=40, upto=45, tolerance=0.0)
    assert not res.ok  # steps to compare existed (41..45) but the old run never had them

"""The resume check's window: exact on every compared step, and fair to a rank whose VM took its tail."""

from __future__ import annotations

from typing import Any

from glue.operations.recovery.resume_check import check_all_ranks, check_resume, merged_metrics, rank_upto
from glue.runs.records import AttemptRecord, RecoveryRecord


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


class _Store:
    """The two reads merged_metrics makes: per-attempt metrics and the attempt records."""

    def __init__(self, metrics: dict[int, dict[int, dict[str, Any]]], classes: dict[int, str]) -> None:
        self._metrics, self._classes = metrics, classes

    def metrics(self, rank: int = 0) -> dict[int, dict[int, dict[str, Any]]]:
        return self._metrics

    def read_attempt(self, n: int) -> AttemptRecord:
        return AttemptRecord.from_dict({"attempt": n, "failure_class": self._classes.get(n)})


def test_a_forced_recovery_after_a_bad_restart_is_judged_against_the_run_before_it() -> None:
    """Attempt 2 resumed wrongly (bad_restart) and ran steps 21..26 off the trajectory; recovering it with
    --force compares attempt 3 against attempt 1's steps, not against the wrong ones."""
    good, wrong = _steps(1, 27), _steps(21, 26, shift=0.5)
    store = _Store({1: good, 2: wrong}, {1: "vm_lost", 2: "bad_restart"})
    old = merged_metrics(store, 3)  # type: ignore[arg-type]
    assert old == good and max(old) == 27
    assert check_resume(old, _steps(21, 30), 20, 27, 0.0).ok
    # An attempt that merely failed (its steps are the run's) still overrides the ones before it.
    store = _Store({1: good, 2: wrong}, {1: "vm_lost", 2: "vm_lost"})
    assert merged_metrics(store, 3)[22] == wrong[22]  # type: ignore[arg-type]


def test_a_nan_loss_never_passes_the_check() -> None:
    """nan compares false with everything: a nan on one side must not read as equal (both nan: it does)."""
    before = _steps(1, 25)
    for bad in (float("nan"), float("inf")):
        res = check_resume(before, {**_steps(21, 30), 22: {"step": 22, "loss": bad}}, 20, 25, 0.0)
        assert not res.ok and "loss at step 22" in (res.problem or ""), res
    nan_before = {**before, 23: {"step": 23, "loss": float("nan")}}
    assert not check_resume(nan_before, _steps(21, 30), 20, 25, 0.0).ok  # nan before, a number after
    # An exact resume of a run that went nan reproduces the nan: that agrees.
    assert check_resume(nan_before, {**_steps(21, 30), 23: {"step": 23, "loss": float("nan")}}, 20, 25, 0.0).ok
    assert check_resume(before, _steps(21, 30), 20, 25, 0.0).ok


def _positions(*recs: tuple[int, float, str]) -> dict[int, dict[str, Any]]:
    return {s: {"loss": loss, "data": data} for s, loss, data in recs}


def test_a_resharded_resume_needs_the_exact_data_position_and_losses_within_the_relative_tolerance() -> None:
    from glue.operations.recovery.resume_check import check_resharded

    # 2 ranks x 8 samples per step before; the checkpoint at step 4 = global sample 64 of epoch 0.
    old = _positions((5, 3.30, "0:64"), (6, 3.25, "0:80"), (7, 3.20, "0:96"))
    ok = check_resharded(old, _positions((5, 3.37, "0:64"), (6, 3.23, "0:72"), (7, 3.31, "0:80")), 4, 7, 0.1)
    assert ok.ok and ok.first_step == 5 and ok.compared == [5, 6, 7]
    moved = check_resharded(old, _positions((5, 3.30, "0:56")), 4, 7, 0.1)
    assert not moved.ok and "starts step 5 at data position 0:56, the lost run was at 0:64" in str(moved.problem)
    far = check_resharded(old, _positions((5, 3.30, "0:64"), (6, 4.1, "0:72")), 4, 7, 0.1)
    assert not far.ok and "loss at step 6 is 4.1 after the resume, 3.25 before" in str(far.problem)
    assert far.compared == [5]
    late = check_resharded(old, _positions((6, 3.25, "0:80")), 4, 7, 0.1)
    assert not late.ok and "first resumed step 6 != checkpoint step 4 + 1" in str(late.problem)
    blind = check_resharded({5: {"loss": 3.3}}, _positions((5, 3.30, "0:64")), 4, 7, 0.1)
    assert not blind.ok and "no data position in the old metrics" in str(blind.problem)
    nan = check_resharded(old, _positions((5, float("nan"), "0:64")), 4, 7, 0.1)
    assert not nan.ok


def test_the_recovery_says_which_check_it_applied() -> None:
    from glue.operations.recovery.resume_check import resume_check_text as as_text

    def resume_check_text(doc: dict[str, Any]) -> str:
        return as_text(RecoveryRecord.from_dict(doc))

    base = {"failed_attempt": 1, "new_attempt": 2, "verified": True}
    assert resume_check_text(base) == "attempt 1 -> 2: verified; check bitwise: losses equal"
    assert "losses within 0.001" in resume_check_text({**base, "tolerance": 0.001})
    resharded = {**base, "resume_check": {"kind": "resharded", "world_size_before": 2, "world_size": 1,
                                          "tolerance": 0.1}}
    assert resume_check_text(resharded) == ("attempt 1 -> 2: verified; check resharded, world size 2 -> 1: data "
                                            "position exact, losses within 0.1 of their size")
    assert "NOT verified (boom)" in resume_check_text({**base, "verified": False, "problem": "boom"})


class _Shipping:
    """Rank 1's metrics of attempt 2 as the bucket lists them while its parts land: step 25's part is still
    in flight for the first listings, after step 26's landed (rank 0 is complete from the start)."""

    def __init__(self) -> None:
        self.listings = 0

    def metrics(self, rank: int = 0) -> dict[int, dict[int, dict[str, Any]]]:
        steps = {1: _steps(1, 26), 2: _steps(21, 26)}
        if rank == 1:
            self.listings += 1
            if self.listings < 3:
                steps[2] = {s: r for s, r in steps[2].items() if s != 25}
        return steps

    def read_attempt(self, n: int) -> AttemptRecord:
        return AttemptRecord.from_dict({"attempt": n, "failure_class": "vm_lost"})


def test_another_ranks_part_in_flight_is_waited_for_not_judged_missing() -> None:
    # Rank 0 has passed the window; rank 1's part with step 25 lands a moment later. The check must judge
    # the steps the rank ran, not one listing's snapshot (a loaded controller saw "step 25 missing").
    store = _Shipping()
    res = check_all_ranks(store, _steps(1, 26), _steps(21, 26), failed_attempt=1, new_attempt=2,  # type: ignore[arg-type]
                          world_size=2, ckpt=20, upto=26, tolerance=0.0, finished_before=False)
    assert res.ok, res.problem
    assert store.listings == 3

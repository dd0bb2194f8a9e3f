"""glue drill's step-by-step comparison of the drill run with its reference: the first step whose
losses disagree and the step input that differs there (the component the resume lost), and a step
missing from either run reported as a problem rather than passed over."""

from __future__ import annotations

from typing import Any

from glue.operations.recovery.drill import DrillResult, compare_losses


def _run(n: int, **at: dict[str, Any]) -> dict[int, dict[str, Any]]:
    steps = {s: {"loss": 5.0 - s / 10, "data": s * 8, "batch": f"b{s}", "rng": f"r{s}"} for s in range(1, n + 1)}
    for step, change in at.items():
        steps[int(step[1:])].update(change)
    return steps


def _result(n: int) -> DrillResult:
    return DrillResult(passed=False, ref_run="r-drill1-ref", drill_run="r-drill1", steps=n, kill_at=n // 2)


def test_equal_runs_compare_every_step() -> None:
    res = _result(10)
    compare_losses(res, _run(10), _run(10), tolerance=0.0)
    assert (res.compared_steps, res.first_bad_step, res.problem) == (10, None, None)


def test_first_divergence_names_the_data_position_not_the_worker_rng() -> None:
    res = _result(10)
    drilled = _run(10, s6={"loss": 9.0, "data": 0, "batch": "other"}, s7={"loss": 9.0})
    compare_losses(res, _run(10), drilled, tolerance=0.0)
    assert (res.first_bad_step, res.component, res.compared_steps) == (6, "data position", 6)


def test_same_inputs_different_loss_is_the_model_or_optimizer_state() -> None:
    res = _result(10)
    compare_losses(res, _run(10), _run(10, s6={"loss": 4.5}), tolerance=0.0)
    assert (res.first_bad_step, res.component) == (6, "model/optimizer state")


def test_a_difference_within_the_tolerance_agrees() -> None:
    res = _result(10)
    compare_losses(res, _run(10), _run(10, s6={"loss": 4.4 + 1e-4}), tolerance=1e-3)
    assert res.first_bad_step is None and res.compared_steps == 10


def test_missing_steps_are_a_problem() -> None:
    res = _result(10)
    drilled = _run(10)
    del drilled[6], drilled[7]
    compare_losses(res, _run(10), drilled, tolerance=0.0)
    assert res.problem == "step(s) 6..7 missing from the drill run: those steps cannot be compared"
    assert res.compared_steps == 8

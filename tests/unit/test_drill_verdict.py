"""glue drill's verdict over real training loops checkpointed by glue.train to a folder: a loop that does not
seed torch is named not reproducible (with the fix), not "lost"; a NumPy stream left unseeded but never drawn
from passes with a warning; an optimizer the resume does not restore is still "lost: ..."."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glue.operations.recovery.checkpoint_diff import Comparison, compare
from glue.operations.recovery.drill import DrillResult, compare_losses, judge
from glue.operations.recovery.drill_verdict import DETERMINISM, before_loss
from glue.train.checkpoint.checkpointer import Checkpointer
from glue.train.checkpoint.format import Commit
from glue.train.layout import COMMIT, step_prefix
from glue.train.loop_state import RNGState

STEPS, LOST_AT = 8, 5  # checkpoints every 2 steps: the drill run resumes from step 4


def _loop(target: Path, *, seed_torch: bool = True, seed_numpy: bool = True, optimizer_saved: bool = True,
          lose_at: int | None = None) -> dict[int, dict[str, Any]]:
    """One attempt of a small training loop; a later attempt on the same target resumes from its newest checkpoint."""
    _ = torch.manual_seed(0) if seed_torch else torch.seed()  # torch.seed(): from the OS, as a new process
    np.random.seed(0 if seed_numpy else None)
    random.seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    ckpt = Checkpointer(target, async_save=False, handle_sigterm=False)
    ckpt.register("model", model)
    ckpt.register("rng", RNGState())
    if optimizer_saved:
        ckpt.register("optimizer", opt)
    start = ckpt.restore() or 0
    losses: dict[int, dict[str, Any]] = {}
    for step in range(start + 1, STEPS + 1):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = {"loss": loss.item()}
        if step % 2 == 0:
            ckpt.save(step, blocking=True)
        if step == lose_at:
            break
    ckpt.close()
    return losses


def _final(ref: Path, drill: Path) -> Comparison:
    def commit(t: Path) -> Commit:
        return Commit.parse((t / step_prefix(STEPS) / COMMIT).read_bytes(), STEPS)

    def reader(t: Path) -> Callable[[str], bytes | None]:
        return lambda key: (t / step_prefix(STEPS) / key).read_bytes()

    return compare((commit(ref), commit(drill)), (reader(ref), reader(drill)))


def _drill(tmp_path: Path, **loop: Any) -> DrillResult:
    """The reference, and a run that loses its VM at step LOST_AT and resumes (a new process: seeded anew)."""
    ref = _loop(tmp_path / "ref", **loop)
    first = _loop(tmp_path / "drill", lose_at=LOST_AT, **loop)
    resumed = _loop(tmp_path / "drill", **loop)
    result = DrillResult(passed=False, ref_run="r-drill1-ref", drill_run="r-drill1", steps=STEPS, kill_at=LOST_AT)
    compare_losses(result, ref, {**first, **resumed}, tolerance=0.0)
    judge(result, before_loss(ref, first, 0.0), _final(tmp_path / "ref", tmp_path / "drill"))
    return result


def test_a_deterministic_loop_passes_with_every_tensor_compared(tmp_path: Path) -> None:
    res = _drill(tmp_path)
    assert (res.passed, res.verdict, res.problem, res.warnings) == (True, "pass", None, [])
    assert res.compared_steps == STEPS and res.compared_tensors >= 4 + 8  # the model's and Adam's tensors
    assert res.compared and "3 objects compared" in res.compared


def test_an_unseeded_torch_loop_is_not_reproducible_not_lost_and_the_fix_is_named(tmp_path: Path) -> None:
    res = _drill(tmp_path, seed_torch=False)
    assert not res.passed and res.verdict == "nondeterministic" and res.first_bad_step == 1, res
    assert res.problem is not None and "lost" not in res.problem.replace("was lost", "")
    assert "loss at step 1 already differs from the reference's, before its VM was lost" in res.problem
    assert "rng.rank0.torch" in res.problem and "torch.manual_seed(0)" in res.problem, res.problem
    assert "rng.rank0.numpy" not in res.problem  # NumPy was seeded: not blamed


def test_an_unseeded_numpy_stream_never_drawn_from_passes_with_a_warning(tmp_path: Path) -> None:
    res = _drill(tmp_path, seed_numpy=False)
    assert res.passed and res.verdict == "pass" and res.problem is None, res
    [warning] = res.warnings
    assert warning.startswith("rng.rank0.numpy") and "every loss agreed" in warning, warning
    assert "np.random.seed(0)" in warning


def test_an_optimizer_the_resume_does_not_restore_is_lost_state(tmp_path: Path) -> None:
    res = _drill(tmp_path, optimizer_saved=False)
    assert not res.passed and res.verdict == "lost", res
    assert res.problem == "the recovered run diverged from the reference"
    assert res.first_bad_step is not None and res.first_bad_step > 4 and res.component == "model/optimizer state"


def test_a_difference_before_the_loss_is_named_even_when_the_recovery_then_failed() -> None:
    res = DrillResult(passed=False, ref_run="r-drill1-ref", drill_run="r-drill1", steps=8, kill_at=5,
                      problem="loss at step 5 is 0.3 after the resume, 0.2 before the failure (tolerance 0.0)")
    ref = {s: {"loss": 1.0 / s, "rng": "a"} for s in range(1, 9)}
    first = {s: {"loss": 1.0 / s + (0.5 if s >= 3 else 0.0), "rng": "a" if s < 3 else "b"} for s in range(1, 6)}
    judge(res, before_loss(ref, first, 0.0), None)
    assert (res.passed, res.verdict, res.first_bad_step) == (False, "nondeterministic", 3)
    assert res.problem is not None and "(step inputs that differ: rng)" in res.problem
    assert DETERMINISM in res.problem and res.problem.endswith("(and then: loss at step 5 is 0.3 after the resume, "
                                                               "0.2 before the failure (tolerance 0.0))")

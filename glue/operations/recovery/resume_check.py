"""The resume check: does the resumed attempt continue exactly where the lost one stopped?

Pure functions over per-step metrics records ({step: {"loss": ..., "batch": ..., "rng": ...}}), so
recover, the drill and their unit tests judge a resume the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from glue.operations.recovery import replay
from glue.runs.records import RecoveryRecord
from glue.runs.store import RunStore

# The trainer's per-step input fingerprints (tiny_gpt logs all three) and what a difference in each means:
# `data` is where the step's samples start in the data order; `batch` their contents (same position, other
# contents: the workers' randomness was lost); `rng` the global random streams.
STEP_INPUTS = {"data": "data position", "batch": "worker RNG", "rng": "rng"}


@dataclass
class ResumeCheck:
    ok: bool
    first_step: int | None
    compared: list[int] = field(default_factory=list)
    problem: str | None = None


def merged_metrics(store: RunStore, before_attempt: int, rank: int = 0) -> dict[int, dict[str, Any]]:
    """step -> record of one rank from the attempts before `before_attempt` (a later attempt overrides).
    An attempt that failed the resume check (bad_restart) ran a wrong trajectory: its steps are not the
    run's, so a forced recovery after it is judged against the attempts before it."""
    out: dict[int, dict[str, Any]] = {}
    for att, steps in sorted(store.metrics(rank).items()):
        rec = store.read_attempt(att) if att < before_attempt else None
        if att < before_attempt and (rec is None or rec.failure_class != "bad_restart"):
            out.update(steps)
    return out


def losses_agree(a: float, b: float, tolerance: float) -> bool:
    """Equal within the tolerance. A nan loss agrees only with a nan (an exact resume of a run that diverged
    reproduces it); `abs(a - b) > tolerance` alone would let a nan on one side pass."""
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance


def check_resume(old: dict[int, dict[str, Any]], new: dict[int, dict[str, Any]], ckpt: int | None,
                 upto: int, tolerance: float, finished_before: bool = False) -> ResumeCheck:
    """The first resumed step must be ckpt + 1; losses at steps both attempts ran must agree.

    `new` empty means the resumed attempt exited 0 without a step. That is right only when the lost
    attempt had finished training (`finished_before`: it wrote every required output) and the
    checkpoint is the last step it reached: the VM died between the end of training and the exit.
    """
    if not new:
        if finished_before and ckpt is not None and old and ckpt >= max(old):
            return ResumeCheck(True, None)
        return ResumeCheck(False, None, problem="the resumed attempt reported no steps")
    first = min(new)
    want = (ckpt or 0) + 1
    if first != want:
        return ResumeCheck(False, first, problem=f"first resumed step {first} != checkpoint step {ckpt} + 1")
    window = list(range(want, upto + 1))  # the steps both attempts must have run
    # Every step of the window must be in both runs: a step missing from either one could hide the very
    # divergence this check exists to find, so it fails rather than being skipped.
    for label, steps in (("the resumed run", new), ("the run before the failure", old)):
        gone = [s for s in window if s not in steps]
        if gone:
            return ResumeCheck(False, first, problem=f"step(s) {step_ranges(gone)} missing from {label}; "
                                                     "nothing can be said about them")
    compared: list[int] = []
    for step in window:
        a, b = float(old[step]["loss"]), float(new[step]["loss"])
        if not losses_agree(a, b, tolerance):
            what = [k for k in STEP_INPUTS if k in old[step] and old[step].get(k) != new[step].get(k)]
            if "data" in what and "batch" in what:
                what.remove("batch")  # other samples have other contents: the position is the cause
            hint = f" (step inputs differ: {', '.join(STEP_INPUTS[k] for k in what)})" if what else ""
            return ResumeCheck(False, first, compared, f"loss at step {step} is {b!r} after the resume, {a!r} "
                               f"before the failure (tolerance {tolerance}){hint}")
        compared.append(step)
    # An empty window is the one case with nothing to compare: the lost attempt died right after
    # saving its checkpoint (upto == ckpt), so the first resumed step is all there is to check.
    return ResumeCheck(True, first, compared)


def check_resharded(old: dict[int, dict[str, Any]], new: dict[int, dict[str, Any]], ckpt: int | None,
                    upto: int, rel_tolerance: float) -> ResumeCheck:
    """The check of a resume at another world size, where a bitwise comparison cannot hold: each rank now
    sees other samples of each step. The first resumed step must be ckpt + 1 and start at exactly the
    global data position the lost run had reached (the trainer's `data` field, e.g. tiny_gpt's
    `epoch:global sample`); losses must agree within `rel_tolerance` of their size."""
    if not new:
        return ResumeCheck(False, None, problem="the resumed attempt reported no steps")
    first = min(new)
    want = (ckpt or 0) + 1
    if first != want:
        return ResumeCheck(False, first, problem=f"first resumed step {first} != checkpoint step {ckpt} + 1")
    before, after = (old.get(first) or {}).get("data"), new[first].get("data")
    if before is None or after is None:
        return ResumeCheck(False, first, problem=f"step {first} has no data position in the "
                                                 f"{'old' if before is None else 'new'} metrics (the trainer reports "
                                                 "none: report data='<epoch>:<global sample>' with each step)")
    if before != after:
        return ResumeCheck(False, first, problem=f"the resumed run starts step {first} at data position {after}, "
                                                 f"the lost run was at {before}")
    compared: list[int] = []
    for step in range(want, upto + 1):
        if step not in old or step not in new:
            continue  # steps differ in size after the change; what both have is compared
        a, b = float(old[step]["loss"]), float(new[step]["loss"])
        if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > rel_tolerance * max(abs(a), abs(b)):
            return ResumeCheck(False, first, compared, f"loss at step {step} is {b!r} after the resume, {a!r} "
                                                       f"before the failure (relative tolerance {rel_tolerance})")
        compared.append(step)
    return ResumeCheck(True, first, compared)


def check_all_ranks(store: RunStore, old: dict[int, dict[str, Any]], new: dict[int, dict[str, Any]], *,
                    failed_attempt: int, new_attempt: int, world_size: int, ckpt: int | None, upto: int,
                    tolerance: float, finished_before: bool) -> ResumeCheck:
    """check_resume on rank 0 (`old`/`new`), then on every other rank: each must continue exactly.
    The attempt numbers, world size and steps are keyword-only: five ints in a row are too easy to swap."""
    check = check_resume(old, new, ckpt, upto, tolerance, finished_before)
    for rank in range(1, world_size):
        if not check.ok:
            break
        before = merged_metrics(store, failed_attempt + 1, rank)
        last = rank_upto(before, upto, ckpt)
        # Not the listing of this instant: a part of this rank's still in flight would read as a missing step.
        new_steps = replay.rank_steps(store, new_attempt, rank, (ckpt or 0) + 1, last)
        per_rank = check_resume(before, new_steps, ckpt, last, tolerance, finished_before)
        if not per_rank.ok:
            check = ResumeCheck(False, per_rank.first_step, check.compared, f"rank {rank}: {per_rank.problem}")
    return check


def rank_upto(before: dict[int, dict[str, Any]], upto: int, ckpt: int | None) -> int:
    """The last step to compare on a rank other than 0. Its steps after its last shipped metrics part or
    heartbeat went down with its VM, so it is compared up to the last step IT recorded; never below the
    checkpoint (the first resumed step is always checked)."""
    return max(min(upto, max(before, default=ckpt or 0)), ckpt or 0)


def step_ranges(steps: list[int]) -> str:
    if not steps:
        return "none (no overlapping steps)"
    return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])


def resume_check_text(rec: RecoveryRecord) -> str:
    """Which resume check a recovery applied and what it found, in words (the report and `glue status`)."""
    check = rec.resume_check or {}
    kind = check.get("kind") or ("tolerance" if rec.tolerance else "exact")
    how = {"exact": "bitwise: losses equal", "tolerance": f"losses within {rec.tolerance}",
           "resharded": f"resharded, world size {check.get('world_size_before')} -> {check.get('world_size')}: "
                        f"data position exact, losses within {check.get('tolerance')} of their size"}.get(kind, kind)
    verdict = "verified" if rec.verified else f"NOT verified ({rec.problem})"
    return f"attempt {rec.failed_attempt} -> {rec.new_attempt}: {verdict}; check {how}"

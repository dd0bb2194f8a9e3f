"""What `glue watch` does about a classified attempt: the decision table, the budgets, the backoff.

Pure (no I/O), so every row of the table is unit-tested. Which class takes which row is each class's
`watch` in glue/runs/class_policy.py; the table below restates it.

| class                                   | action                                           |
|-----------------------------------------|--------------------------------------------------|
| running                                 | nothing                                          |
| completed                               | done: the run is no longer polled                |
| vm_lost, preempted                      | recover, from the preemption budget              |
| capped (a serverless run's cap reached) | continue in the next execution, from no budget   |
| stall, comm, storage_lost, killed       | recover, from the failure budget                 |
| oom_gpu, oom_host                       | stop: no retry (it repeats); event `oom`         |
| bad_restart                             | stop: the resume is wrong; event `bad_restart`   |
| user_error, export_missing              | stop: a restart does not fix it; event `failed`  |

A budget counts failures recovered: the first recovery of a failed attempt takes one from its budget;
retrying that same failure after a failed recovery does not take another. Before the retry after k
failed recoveries in a row the watcher waits backoff_seconds·2^(k-1), at most backoff_max_seconds;
after MAX_TRIES failed recoveries of one failure it stops (event `recovery_failed`). A budget used up
or the deadline passed stops the run too (event `budget_exhausted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glue.runs.class_policy import AttemptClass, Budget, policy_of
from glue.runs.config import RecoverySpec

MAX_TRIES = 5  # failed recoveries of one failure before the watcher gives up on it

Action = Literal["none", "done", "recover", "wait", "stop"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    budget: Budget | None = None
    event: str | None = None  # the notification a stop sends


def limit(spec: RecoverySpec, budget: Budget) -> int:
    return spec.max_preemptions if budget == "preemptions" else spec.max_failures


def backoff(spec: RecoverySpec, failed_in_row: int) -> float:
    """Seconds to wait before the next recovery after `failed_in_row` failed recoveries in a row."""
    if failed_in_row <= 0:
        return 0.0
    return float(min(spec.backoff_seconds * 2 ** (failed_in_row - 1), spec.backoff_max_seconds))


def decide(outcome: AttemptClass, spec: RecoverySpec, used: dict[str, int], now: float, next_try_at: float,
           started_at: float | None, retry: int = 0, capacity_waits: int = 0) -> Decision:
    """The action for a run whose latest attempt is classified `outcome`.

    used: failures recovered so far per budget; next_try_at: epoch seconds the backoff ends;
    started_at: epoch seconds of the run's first start (for deadline_hours); retry: failed recoveries
    of THIS failure so far (0 = a new failure, which takes one from its budget); capacity_waits: times
    THIS failure's recovery found no capacity (its budget is taken already, and waiting is no failure)."""
    policy = policy_of(outcome)
    if policy.watch == "none":
        return Decision("none", "running")
    if policy.watch == "done":
        return Decision("done", "completed")
    if policy.stop_event is not None:
        return Decision("stop", f"{outcome}: no automatic retry", event=policy.stop_event)
    if policy.watch == "continue":  # chaining executions is the plan, not a failure: no budget, no deadline
        if retry >= MAX_TRIES:
            return Decision("stop", f"capped: {retry} starts of the next execution failed; giving up",
                            event="recovery_failed")
        if retry > 0 and now < next_try_at:
            return Decision("wait", f"capped: backing off {next_try_at - now:.0f}s")
        return Decision("recover", "capped: the execution reached its cap; the next one continues (no budget)")
    budget = policy.budget
    if budget is None:  # the other watch kinds are budgets (test_class_policy); a new kind: leave it to a human
        return Decision("stop", f"{outcome}: not recovered automatically", event="failed")
    if spec.deadline_hours is not None and started_at is not None \
            and now > started_at + spec.deadline_hours * 3600:
        return Decision("stop", f"{outcome} after the deadline ({spec.deadline_hours:g} h after the run started)",
                        budget, "budget_exhausted")
    cap = limit(spec, budget)
    if capacity_waits > 0 and retry == 0:
        if now < next_try_at:
            return Decision("wait", f"{outcome}: waiting {next_try_at - now:.0f}s for capacity", budget)
        return Decision("recover", f"{outcome}: asking again for a VM (no capacity {capacity_waits}x)", budget)
    if retry >= MAX_TRIES:
        return Decision("stop", f"{outcome}: {retry} recoveries of this failure failed; giving up", budget,
                        "recovery_failed")
    if retry > 0:
        if now < next_try_at:
            return Decision("wait", f"{outcome}: backing off {next_try_at - now:.0f}s", budget)
        return Decision("recover", f"{outcome}: retry {retry + 1}/{MAX_TRIES} of this failure's recovery", budget)
    if used.get(budget, 0) >= cap:
        return Decision("stop", f"{outcome}: the {budget} budget is used up ({used.get(budget, 0)}/{cap})",
                        budget, "budget_exhausted")
    if now < next_try_at:
        return Decision("wait", f"{outcome}: backing off {next_try_at - now:.0f}s", budget)
    return Decision("recover", f"{outcome}: recovery {used.get(budget, 0) + 1}/{cap} of the {budget} budget", budget)

"""A recovery whose watcher died after the new attempt started: when its resume can be checked, and
the recovery record that check makes (the same check and record shape as `glue recover`'s)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from glue.operations.recovery import phases, replay
from glue.operations.recovery.resume_check import ResumeCheck, check_all_ranks, check_resharded, merged_metrics
from glue.operations.recovery.resume_plan import ResumePlan
from glue.runs.records import RecoveryRecord
from glue.runs.store import RunStore, parse_iso, utc_iso


def readiness(store: RunStore, plan: ResumePlan) -> tuple[bool, str | None, dict[int, dict[str, Any]]]:
    """(ready, what it still waits for or None, the new attempt's steps). Ready once the new attempt
    passed the plan's step (or finished); not ready and nothing to wait for once it failed before."""
    new, upto = plan.new_attempt, plan.upto
    steps = store.metrics().get(new, {})
    exit_rec = store.exit_record(new)
    passed = bool(steps) and max(steps) >= upto
    # As glue recover's replay: a gap before `upto` may be a metrics part still in flight; judged once the
    # step past `upto` is SETTLE_S old.
    settled = passed and (replay.steps_complete(steps, (plan.checkpoint_step or 0) + 1, upto) or
                          _age_s(steps[max(steps)].get("t")) >= replay.SETTLE_S)
    ready = bool(settled or (exit_rec is not None and exit_rec.get("exit_code") == 0))
    if ready:
        return True, None, steps
    rec = store.read_attempt(new)
    failed = (rec and rec.failure_class) or exit_rec is not None or store.attempts()[-1] != new
    waiting = None if failed else f"checking attempt {new}'s resume at step {upto} (now {max(steps, default=0)})"
    return False, waiting, steps


def _age_s(t: str | None) -> float:
    return (datetime.now(UTC) - parse_iso(t)).total_seconds() if t else 0.0


def check(store: RunStore, plan: ResumePlan,
          steps: dict[int, dict[str, Any]]) -> tuple[ResumeCheck, RecoveryRecord]:
    """Check the resume and record it as recoveries/<k>.json (`interrupted: true`)."""
    failed, new = plan.failed_attempt, plan.new_attempt
    ckpt, failure_step = plan.checkpoint_step, plan.failure_step
    old = merged_metrics(store, failed + 1)
    resume_check = plan.resume_check
    if resume_check.get("kind") == "resharded":  # the attempt runs on fewer VMs (recovery.min_nodes)
        verdict = check_resharded(old, steps, ckpt, min(plan.upto, failure_step),
                                  float(resume_check.get("tolerance") or 0.1))
    else:
        verdict = check_all_ranks(store, old, steps, failed_attempt=failed, new_attempt=new,
                                  world_size=plan.world_size, ckpt=ckpt, upto=min(plan.upto, failure_step),
                                  tolerance=plan.tolerance, finished_before=plan.finished_before)
    first_t = steps[min(steps)]["t"] if steps else None
    reach_t = steps.get(failure_step, {}).get("t")
    result = {
        "run": store.run, "failed_attempt": failed, "new_attempt": new, "failure_class": plan.failure_class,
        "checkpoint_step": ckpt, "failure_step": failure_step,
        "seconds": {**plan.seconds, "restore": phases.secs_between(plan.started_at, first_t),
                    "replay": phases.secs_between(first_t, reach_t) if reach_t else None},
        "work_lost": {"steps": failure_step - (ckpt or 0),
                      "seconds": phases.secs_between(old.get(ckpt or 0, {}).get("t"),
                                                     old.get(failure_step, {}).get("t")) if ckpt else None},
        "verified": verdict.ok, "first_resumed_step": verdict.first_step, "compared_steps": verdict.compared,
        "problem": verdict.problem, "tolerance": plan.tolerance, "recorded_at": utc_iso(),
        "kept_vm": None, "interrupted": True, "resume_check": resume_check or None,
    }
    record = RecoveryRecord.from_dict(result)  # as it stands: the keys an interrupted one knows
    phases.record(store, record)
    return verdict, record

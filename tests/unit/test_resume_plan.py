"""The resume plan a started recovery leaves in the watch state: one type, its JSON as before."""

from __future__ import annotations

import json

from glue.operations.recovery.resume_plan import ResumePlan

# A watch state's `resume_plan` as gpukit wrote it before the type (glue.operations.recovery.recover.plan).
STORED = {"failed_attempt": 1, "new_attempt": 2, "failure_class": "preempted", "checkpoint_step": 20,
          "failure_step": 27, "upto": 27, "world_size": 2, "finished_before": False, "tolerance": 0.0,
          "started_at": "2026-12-07T10:00:00.000Z", "seconds": {"detect": 1.5, "provision": 0.2},
          "resume_check": {"kind": "exact", "world_size_before": 2, "world_size": 2, "tolerance": 0.0}}


def test_a_stored_plan_reads_back_to_the_same_json() -> None:
    plan = ResumePlan.from_dict(json.loads(json.dumps(STORED)))
    assert plan.new_attempt == 2 and plan.upto == 27 and plan.world_size == 2
    assert plan.resume_check["kind"] == "exact" and plan.seconds["detect"] == 1.5
    assert plan.to_dict() == STORED


def test_an_older_plan_without_the_later_keys_reads_as_a_lost_vm_exact_check() -> None:
    old = {"failed_attempt": 3, "new_attempt": 4, "checkpoint_step": None, "failure_step": 9, "upto": 9,
           "failure_class": None, "tolerance": None}
    plan = ResumePlan.from_dict(old)
    assert plan.failure_class == "vm_lost" and plan.checkpoint_step is None and plan.tolerance == 0.0
    assert plan.resume_check == {} and plan.world_size == 1 and not plan.finished_before
    assert ResumePlan.from_dict(plan.to_dict()) == plan


def test_a_key_the_plan_does_not_know_is_ignored() -> None:
    assert ResumePlan.from_dict({**STORED, "written_later": 1}) == ResumePlan.from_dict(STORED)

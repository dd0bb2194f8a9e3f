"""`glue incidents` shows every kind of record that lands in a run's incidents/ folder."""

from __future__ import annotations

from glue.commands.runs import incident_lines
from glue.train import layout

ATTEMPT = {"run": "r1", "attempt": 1, "vm": "gpukit-1", "class": "vm_lost", "reason": "the VM is gone",
           "detected_at": "2026-12-02T08:00:00Z", "last_completed_step": 57, "last_valid_checkpoint": 40,
           "policy": "recover onto a new VM: glue recover --run r1"}
BUDGET = {"run": "r1", "attempt": 3, "class": "budget_exhausted", "reason": "3 recoveries used of 3",
          "policy": "stopped: recover by hand", "detected_at": "2026-12-02T08:10:00Z",
          "failure_class": "vm_lost", "failure_reason": "the VM is gone"}
# What glue.train writes when a restore skips a checkpoint whose save was cut off (the run's prefix is the target).
INTERRUPTED = {"class": "ckpt_interrupted", "at": "2026-12-02T08:05:00Z", "target": layout.run_uri("gpukit", "r1"),
               "step": 60, "object": f"step-00000060/{layout.COMMIT}", "what": "COMMIT.json is missing",
               "objects": [], "fell_back_to": 40, "rank": 0, "host": "gpukit-1", "pid": 7}


def test_an_attempt_failure_names_its_vm_steps_and_next_step() -> None:
    head, *rest = incident_lines(ATTEMPT)
    assert "attempt 1 on gpukit-1" in head and "vm_lost" in head and "the VM is gone" in head
    assert "last completed step 57, last valid checkpoint 40" in rest
    assert rest[-1] == "next: recover onto a new VM: glue recover --run r1"


def test_a_budget_incident_has_no_vm_or_steps_and_still_shows() -> None:
    head, *rest = incident_lines(BUDGET)
    assert "attempt 3" in head and "budget_exhausted" in head and " on " not in head
    assert "after vm_lost: the VM is gone" in rest and rest[-1] == "next: stopped: recover by hand"


def test_a_checkpoint_incident_from_the_trainer_shows_its_step_and_fallback() -> None:
    head, *rest = incident_lines(INTERRUPTED)
    assert head.startswith("[bold]2026-12-02T08:05:00Z[/] checkpoint step 60") and "ckpt_interrupted" in head
    assert "the restore fell back to step 40" in rest[0]
    assert incident_lines({**INTERRUPTED, "fell_back_to": None})[1].endswith("no valid checkpoint was left to "
                                                                              "restore from")


def test_markup_in_a_reason_is_shown_not_interpreted() -> None:
    head = incident_lines({**ATTEMPT, "reason": "RuntimeError: [bold] in a message"})[0]
    assert "\\[bold] in a message" in head

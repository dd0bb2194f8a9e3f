"""The classifier on recorded log fixtures and evidence combinations."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from glue.runs.classify import Evidence, Outcome, classify

LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize(
    ("fixture", "exit_code", "expected"),
    [
        ("cuda_oom.log", 1, Outcome.OOM_GPU),
        ("nccl_timeout.log", 134, Outcome.COMM),
        ("gloo_peer.log", 1, Outcome.COMM),
        ("value_error.log", 1, Outcome.USER_ERROR),
        ("cpu_oom.log", 1, Outcome.OOM_HOST),
    ],
)
def test_log_fixtures(fixture: str, exit_code: int, expected: Outcome) -> None:
    text = (LOGS / fixture).read_text()
    verdict = classify(Evidence(exit_code=exit_code, log_tail=text, ssh_reachable=True, vm_status="running",
                                process_alive=False))
    assert verdict.outcome is expected
    assert verdict.excerpt  # the incident carries the error, not just the class


def test_user_error_excerpt_holds_the_exception() -> None:
    v = classify(Evidence(exit_code=1, error_text=(LOGS / "value_error.log").read_text(), process_alive=False))
    assert "ValueError: batch_size must be positive" in v.excerpt


def test_sigkill_with_oom_record_is_host_oom_without_it_killed() -> None:
    assert classify(Evidence(exit_signal=signal.SIGKILL, oom_kills=1)).outcome is Outcome.OOM_HOST
    v = classify(Evidence(exit_signal=signal.SIGKILL, oom_kills=0, ssh_reachable=True))
    assert v.outcome is Outcome.KILLED and "SIGKILL" in v.reason


def test_vm_gone_is_vm_lost_even_without_exit_record() -> None:
    assert classify(Evidence(vm_status="gone", ssh_reachable=False)).outcome is Outcome.VM_LOST
    assert classify(Evidence(ssh_reachable=False)).outcome is Outcome.VM_LOST


def test_stall_needs_live_process_and_old_heartbeat() -> None:
    base = dict(process_alive=True, heartbeat_step=40, stall_timeout_s=30.0, vm_status="running")
    assert classify(Evidence(heartbeat_age_s=5.0, **base)).outcome is Outcome.RUNNING  # type: ignore[arg-type]
    v = classify(Evidence(heartbeat_age_s=45.0, **base))  # type: ignore[arg-type]
    assert v.outcome is Outcome.STALL and "step 40" in v.reason
    assert classify(Evidence(process_stopped=True, heartbeat_age_s=1.0, **base)).outcome is Outcome.STALL  # type: ignore[arg-type]


def test_completed_only_with_required_outputs() -> None:
    assert classify(Evidence(exit_code=0)).outcome is Outcome.COMPLETED
    v = classify(Evidence(exit_code=0, outputs_missing=["model.pt"]))
    assert v.outcome is Outcome.EXPORT_MISSING and "model.pt" in v.reason


def test_bad_restart_wins() -> None:
    v = classify(Evidence(exit_code=0, resume_problem="first resumed step 7 != checkpoint step 10 + 1"))
    assert v.outcome is Outcome.BAD_RESTART


def test_exit_record_before_vm_loss_wins() -> None:
    assert classify(Evidence(vm_status="gone", exit_code=0)).outcome is Outcome.COMPLETED
    assert classify(Evidence(vm_status="gone", exit_code=1, error_text="ValueError: x")).outcome \
        is Outcome.USER_ERROR

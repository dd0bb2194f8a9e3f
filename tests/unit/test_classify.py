"""The classifier on recorded log fixtures and evidence combinations."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from glue.runs.classify import AttemptClass, Evidence, classify
from glue.runs.monitor import stall_timeout_s
from glue.train import layout

LOGS = Path(__file__).parent / "fixtures" / "logs"
TARGET = f"/mnt/s3/{layout.RUNS_PREFIX}r"  # a run's checkpoint target through the bucket mount


@pytest.mark.parametrize(
    ("fixture", "exit_code", "expected"),
    [
        ("cuda_oom.log", 1, AttemptClass.OOM_GPU),
        ("nccl_timeout.log", 134, AttemptClass.COMM),
        ("gloo_peer.log", 1, AttemptClass.COMM),
        ("value_error.log", 1, AttemptClass.USER_ERROR),
        ("cpu_oom.log", 1, AttemptClass.OOM_HOST),
    ],
)
def test_log_fixtures(fixture: str, exit_code: int, expected: AttemptClass) -> None:
    text = (LOGS / fixture).read_text()
    verdict = classify(Evidence(exit_code=exit_code, log_tail=text, ssh_reachable=True, vm_status="running",
                                process_alive=False))
    assert verdict.outcome is expected
    assert verdict.excerpt  # the incident carries the error, not just the class


def test_user_error_excerpt_holds_the_exception() -> None:
    v = classify(Evidence(exit_code=1, error_text=(LOGS / "value_error.log").read_text(), process_alive=False))
    assert "ValueError: batch_size must be positive" in v.excerpt


def test_sigkill_with_oom_record_is_host_oom_without_it_killed() -> None:
    assert classify(Evidence(exit_signal=signal.SIGKILL, oom_kills=1)).outcome is AttemptClass.OOM_HOST
    v = classify(Evidence(exit_signal=signal.SIGKILL, oom_kills=0, ssh_reachable=True))
    assert v.outcome is AttemptClass.KILLED and "SIGKILL" in v.reason


def test_vm_gone_is_vm_lost_even_without_exit_record() -> None:
    assert classify(Evidence(vm_status="gone", ssh_reachable=False)).outcome is AttemptClass.VM_LOST
    assert classify(Evidence(ssh_reachable=False)).outcome is AttemptClass.VM_LOST


def test_an_unanswered_ssh_right_after_the_trainer_ended_is_no_lost_vm() -> None:
    """The trainer's closing heartbeat says it ended; its supervisor writes the exit record next. An SSH that
    answers slowly in those seconds (a loaded host, a jump host) is not a lost VM; long after, it is."""
    ending = classify(Evidence(vm_status="running", ssh_reachable=False, process_alive=False, trainer_ended_s=3.8,
                               stall_timeout_s=30))
    assert ending.outcome is AttemptClass.RUNNING and "its exit record is still to come" in ending.reason
    assert classify(Evidence(ssh_reachable=False, process_alive=False, trainer_ended_s=31,
                             stall_timeout_s=30)).outcome is AttemptClass.VM_LOST
    assert classify(Evidence(vm_status="gone", ssh_reachable=False, trainer_ended_s=1)).outcome is AttemptClass.VM_LOST


def test_a_spot_vm_gone_is_preempted_an_unreachable_one_and_an_ended_attempt_are_not() -> None:
    """A reclaimed spot VM carries no notice on Lyceum (only its status changes): preempted, its budget."""
    d = classify(Evidence(vm_status="gone", ssh_reachable=False, spot=True, lost_vms=["gpukit-2"]))
    assert d.outcome is AttemptClass.PREEMPTED and "spot VM gpukit-2 gone" in d.reason
    assert classify(Evidence(ssh_reachable=False, spot=True)).outcome is AttemptClass.VM_LOST  # not known gone
    assert classify(Evidence(vm_status="gone", exit_code=1, error_text="ValueError: x", spot=True)).outcome \
        is AttemptClass.USER_ERROR


def test_stall_needs_live_process_and_old_heartbeat() -> None:
    base = dict(process_alive=True, heartbeat_step=40, stall_timeout_s=30.0, vm_status="running")
    assert classify(Evidence(heartbeat_age_s=5.0, **base)).outcome is AttemptClass.RUNNING  # type: ignore[arg-type]
    v = classify(Evidence(heartbeat_age_s=45.0, **base))  # type: ignore[arg-type]
    assert v.outcome is AttemptClass.STALL and "step 40" in v.reason
    assert classify(Evidence(process_stopped=True, heartbeat_age_s=1.0, **base)).outcome is AttemptClass.STALL  # type: ignore[arg-type]


def test_completed_only_with_required_outputs() -> None:
    assert classify(Evidence(exit_code=0)).outcome is AttemptClass.COMPLETED
    v = classify(Evidence(exit_code=0, outputs_missing=["model.pt"]))
    assert v.outcome is AttemptClass.EXPORT_MISSING and "model.pt" in v.reason


def test_bad_restart_wins() -> None:
    v = classify(Evidence(exit_code=0, resume_problem="first resumed step 7 != checkpoint step 10 + 1"))
    assert v.outcome is AttemptClass.BAD_RESTART


def test_exit_record_before_vm_loss_wins() -> None:
    assert classify(Evidence(vm_status="gone", exit_code=0)).outcome is AttemptClass.COMPLETED
    assert classify(Evidence(vm_status="gone", exit_code=1, error_text="ValueError: x")).outcome \
        is AttemptClass.USER_ERROR


@pytest.mark.parametrize(
    "error",
    [
        "SaveFailedError: checkpoint of step 40 failed and was not committed: cannot write "
        f"{TARGET}/{layout.step_prefix(40)}model.pt: permission denied",
        f"OSError: [Errno 107] Transport endpoint is not connected: '{TARGET}/{layout.CKPT_PREFIX.rstrip('/')}'",
        f"OSError: [Errno 5] Input/output error: '{TARGET}/{layout.commit_key(10)}'",
        f"glue.train.errors.TargetError: {TARGET} is under /mnt/s3 but the bucket is not mounted there",
        "glue.train.errors.TargetError: cannot reach S3 endpoint http://127.0.0.1:9000: EndpointConnectionError",
        f"glue.train.errors.StorageError: put {layout.step_prefix(3)}model.pt failed after 6 attempts over 30.2s: "
        "timeout",
    ],
)
def test_a_lost_bucket_is_storage_lost_not_the_users_error(error: str) -> None:
    v = classify(Evidence(exit_code=1, error_text=f"Traceback (most recent call last):\n{error}", process_alive=False,
                          ssh_reachable=True, vm_status="running"))
    assert v.outcome is AttemptClass.STORAGE_LOST and "recover" in v.policy
    assert error.split(":")[0] in v.excerpt


def test_a_permission_error_elsewhere_stays_the_users() -> None:
    v = classify(Evidence(exit_code=1, error_text="PermissionError: [Errno 13] Permission denied: '/home/u/data'",
                          process_alive=False))
    assert v.outcome is AttemptClass.USER_ERROR


def test_a_trainer_stuck_on_a_dead_mount_is_storage_lost_not_a_stall() -> None:
    dead = "the bucket mount at /mnt/s3 on gpukit-2 is dead (Transport endpoint is not connected)"
    v = classify(Evidence(process_alive=True, heartbeat_age_s=90, stall_timeout_s=20, heartbeat_step=40,
                          storage_problem=dead))
    assert v.outcome is AttemptClass.STORAGE_LOST and "dead" in v.reason
    assert classify(Evidence(process_alive=True, heartbeat_age_s=90, stall_timeout_s=20)).outcome is AttemptClass.STALL
    running = classify(Evidence(process_alive=True, heartbeat_age_s=1, storage_problem=dead))
    assert running.outcome is AttemptClass.RUNNING
    denied = f"OSError: [Errno 13] Permission denied: '/mnt/s3/{layout.LOGS_PREFIX}x'"
    v = classify(Evidence(exit_code=1, error_text=denied, storage_problem=dead, process_alive=False))
    assert v.outcome is AttemptClass.STORAGE_LOST and v.reason == dead
    # A bug of the trainer's own stays the trainer's, dead mount or not.
    v = classify(Evidence(exit_code=1, error_text="ValueError: boom", storage_problem=dead, process_alive=False))
    assert v.outcome is AttemptClass.USER_ERROR


def test_a_trainer_before_its_first_step_has_the_startup_budget() -> None:
    """Imports, data and compilation come before the first step (minutes for a real job, many seconds on a loaded
    host): until rank 0 reports one, the live trainer is a stall only past monitor.startup_timeout_seconds."""
    mon = {"stall_timeout_seconds": 20, "startup_timeout_seconds": 120}
    assert stall_timeout_s(mon, 7) == 20 and stall_timeout_s(mon, None) == 120
    assert stall_timeout_s({"stall_timeout_seconds": 600, "startup_timeout_seconds": 120}, None) == 600  # never less
    assert stall_timeout_s({}, None) == 300 and stall_timeout_s({}, 0) == 60  # an old manifest: the defaults
    starting = Evidence(process_alive=True, heartbeat_age_s=90, stall_timeout_s=stall_timeout_s(mon, None))
    assert classify(starting).outcome is AttemptClass.RUNNING
    stuck = Evidence(process_alive=True, heartbeat_age_s=90, heartbeat_step=7, stall_timeout_s=stall_timeout_s(mon, 7))
    assert classify(stuck).outcome is AttemptClass.STALL

"""Failure classification: evidence in, one class and the reason out. Pure, so it is testable on
recorded fixtures. The classes and what each allows: glue/runs/class_policy.py (AttemptClass is defined
there and re-exported here); docs/design.md, section 6 "Failure classes and policies".
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from glue.runs.class_policy import AttemptClass, policy_of
from glue.train.run.notice import PREEMPTED_EXIT

GPU_OOM = re.compile(r"torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                     r"cudaErrorMemoryAllocation")
HOST_OOM = re.compile(r"\bMemoryError\b|DefaultCPUAllocator: can't allocate memory|Cannot allocate memory|"
                      r"std::bad_alloc")
COMM = re.compile(r"NCCL (error|WARN)|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                  r"ProcessGroupNCCL|Watchdog caught collective operation timeout|\[/?gloo|gloo::|"
                  r"RendezvousTimeoutError|RendezvousClosedError|DistNetworkError|DistStoreError|"
                  r"Timed out initializing process group|Connection closed by peer|"
                  r"socket timeout|Broken pipe.*(gloo|c10d)|c10d.*(timeout|Timeout)")

# The bucket went away under the trainer: a dead FUSE mount (ENOTCONN, EIO), a mount that lost its rights
# under /mnt/s3, or the S3 endpoint unreachable or refusing past the trainer's retries. Infrastructure.
STORAGE = re.compile(r"Transport endpoint is not connected|\[Errno 107\]|\[Errno 5\] Input/output error|"
                     r"(?i:(permission denied|read-only file system|stale file handle)[^\n]*/mnt/s3)|"
                     r"(?i:/mnt/s3[^\n]*(permission denied|read-only file system|input/output error))|"
                     r"is under /mnt/s3 but the bucket is not mounted|cannot reach S3 endpoint|"
                     r"EndpointConnectionError|Could not connect to the endpoint URL|"
                     r"StorageError: .* failed after \d+ attempts")


@dataclass
class Evidence:
    """What the monitor gathered about an attempt. None means "unknown"."""

    vm_status: str | None = None              # backend's view: running | gone
    ssh_reachable: bool | None = None
    process_alive: bool | None = None          # the trainer (or its supervisor) on the VM
    process_stopped: bool = False              # state T (SIGSTOP, debugger)
    exit_code: int | None = None               # from the supervisor's exit record
    exit_signal: int | None = None
    oom_kills: int = 0                         # cgroup memory.events oom_kill / memory.oom_control delta
    dmesg_oom: bool = False
    log_tail: str = ""
    error_text: str = ""                       # the trainer's error file (exception + traceback)
    heartbeat_age_s: float | None = None
    heartbeat_step: int | None = None
    trainer_ended_s: float | None = None       # seconds since the trainer's closing heartbeat (it ended on its own)
    stall_timeout_s: float = 60.0
    outputs_missing: list[str] = field(default_factory=list)
    resume_problem: str | None = None          # from the resume verifier
    storage_problem: str | None = None         # the run writes through /mnt/s3 and that mount is dead
    lost_vms: list[str] = field(default_factory=list)          # a group's VMs the backend reports gone
    failure_events: list[dict[str, Any]] = field(default_factory=list)  # across ranks, earliest (the cause) first
    notice: dict[str, Any] | None = None       # the trainer's record of a termination notice (glue.train.run.notice)
    spot: bool = False                         # the run's VMs are spot VMs: the cloud reclaims them, often unannounced


@dataclass(frozen=True)
class Diagnosis:
    """The classifier's answer for one attempt: its class, why, and the log lines that show it. Not a run's
    acceptance (glue.runs.acceptance.Acceptance)."""

    outcome: AttemptClass
    reason: str
    excerpt: str = ""

    @property
    def policy(self) -> str:
        return policy_of(self.outcome).text


def _excerpt(text: str, pattern: re.Pattern[str] | None = None, lines: int = 12) -> str:
    rows = text.strip().splitlines()
    if pattern is not None:
        for i, row in enumerate(rows):
            if pattern.search(row):
                return "\n".join(rows[max(0, i - 2): i + lines - 2])
    return "\n".join(rows[-lines:])


def _finished(ev: Evidence) -> bool:
    return ev.exit_code is not None or ev.exit_signal is not None


def _from_resume(ev: Evidence, text: str) -> Diagnosis | None:
    return Diagnosis(AttemptClass.BAD_RESTART, ev.resume_problem) if ev.resume_problem else None


def _from_notice(ev: Evidence, text: str) -> Diagnosis | None:
    n = ev.notice
    ended = ev.vm_status == "gone" or not _finished(ev) or ev.exit_code == PREEMPTED_EXIT or ev.exit_signal is not None
    if n is None or ev.process_alive or not ended:
        return None
    if str(n.get("source") or "").startswith("stop-at") and n.get("saved_step") is not None:
        return Diagnosis(AttemptClass.CAPPED, f"saved step {n['saved_step']} and stopped before the execution's "
                         "run-time cap; the next execution continues from it")
    saved = f"checkpoint {n['saved_step']} saved" if n.get("saved_step") is not None else \
        "the VM went before the checkpoint at the notice committed"
    return Diagnosis(AttemptClass.PREEMPTED,
                     f"termination notice ({n.get('source')}) at step {n.get('step')}; {saved}")


def _from_vm_gone(ev: Evidence, text: str) -> Diagnosis | None:
    # An exit record written before the VM went means the attempt ended on its own first; in a group,
    # the survivors' exits after a VM was lost are consequences (the timeline puts the loss first).
    cause_lost = bool(ev.failure_events) and ev.failure_events[0].get("kind") == "vm_lost"
    if ev.vm_status != "gone" or (_finished(ev) and not cause_lost):
        return None
    which = f"VM {', '.join(ev.lost_vms)}" if ev.lost_vms else "the VM"
    if ev.spot:  # a reclaimed spot VM shows only as a status change (Lyceum sends no notice)
        return Diagnosis(AttemptClass.PREEMPTED, f"the backend reports spot {which} gone: reclaimed without "
                         "a notice; resumes from the last checkpoint")
    return Diagnosis(AttemptClass.VM_LOST, f"the backend reports {which} gone; SSH "
                     + ("does not answer" if not ev.ssh_reachable else "still answered"))


def _from_live_process(ev: Evidence, text: str) -> Diagnosis | None:
    if not ev.process_alive:
        return None
    age = ev.heartbeat_age_s
    if ev.process_stopped or (age is not None and age > ev.stall_timeout_s):
        if ev.storage_problem and not ev.process_stopped:  # stuck on the dead mount, not a hung trainer
            return Diagnosis(AttemptClass.STORAGE_LOST, f"{ev.storage_problem}; heartbeat step {ev.heartbeat_step} "
                             f"unchanged for {age or 0:.0f}s", _excerpt(text))
        why = "stopped (state T)" if ev.process_stopped else "alive"
        return Diagnosis(AttemptClass.STALL, f"process {why}, heartbeat step {ev.heartbeat_step} unchanged for "
                         f"{age or 0:.0f}s (timeout {ev.stall_timeout_s:.0f}s)")
    return Diagnosis(AttemptClass.RUNNING, f"heartbeat step {ev.heartbeat_step}, {age or 0:.0f}s ago")


def _from_missing_exit(ev: Evidence, text: str) -> Diagnosis | None:
    if _finished(ev):
        return None
    if ev.ssh_reachable is False:
        if ev.trainer_ended_s is not None and ev.trainer_ended_s <= ev.stall_timeout_s:
            # Its supervisor is writing the exit record: an SSH that answers slowly just now is no lost VM.
            return Diagnosis(AttemptClass.RUNNING, f"the trainer ended {ev.trainer_ended_s:.0f}s ago (its last "
                             "heartbeat said so); its exit record is still to come")
        return Diagnosis(AttemptClass.VM_LOST, "SSH does not answer and there is no exit record")
    return Diagnosis(AttemptClass.KILLED, "the trainer is gone without an exit record (its supervisor was killed)",
                     _excerpt(ev.log_tail))


def _from_clean_exit(ev: Evidence, text: str) -> Diagnosis | None:
    if ev.exit_code != 0:
        return None
    if ev.outputs_missing:
        return Diagnosis(AttemptClass.EXPORT_MISSING, "finished, but required outputs are missing from the bucket: "
                         + ", ".join(ev.outputs_missing))
    return Diagnosis(AttemptClass.COMPLETED, "exit 0 and every required output is in the bucket")


def _from_memory(ev: Evidence, text: str) -> Diagnosis | None:
    if GPU_OOM.search(text):
        return Diagnosis(AttemptClass.OOM_GPU, "CUDA out of memory", _excerpt(text, GPU_OOM))
    killed9 = ev.exit_signal == _signal.SIGKILL or ev.exit_code == 137
    # Under torchrun the OOM-killed worker's launcher exits 1, not SIGKILL: the cgroup record decides.
    if ev.oom_kills > 0 or (killed9 and ev.dmesg_oom):
        return Diagnosis(AttemptClass.OOM_HOST, f"SIGKILL by the kernel OOM killer ({ev.oom_kills} oom_kill "
                         "event(s) in the trainer's memory cgroup)", _excerpt(text))
    if HOST_OOM.search(text):
        return Diagnosis(AttemptClass.OOM_HOST, "host memory allocation failed", _excerpt(text, HOST_OOM))
    return None


def _from_storage(ev: Evidence, text: str) -> Diagnosis | None:
    if ev.storage_problem and "/mnt/s3" in text:  # the error was about the mount the monitor found dead
        return Diagnosis(AttemptClass.STORAGE_LOST, ev.storage_problem, _excerpt(text, STORAGE))
    if STORAGE.search(text):
        return Diagnosis(AttemptClass.STORAGE_LOST, "the bucket was lost under the trainer (mount gone or bucket "
                         "unreachable)", _excerpt(text, STORAGE))
    return None


def _from_comm(ev: Evidence, text: str) -> Diagnosis | None:
    if COMM.search(text):
        return Diagnosis(AttemptClass.COMM, "collective communication failed", _excerpt(text, COMM))
    return None


def _from_signal(ev: Evidence, text: str) -> Diagnosis | None:
    if ev.exit_signal is None:
        return None
    try:
        name = _signal.Signals(ev.exit_signal).name
    except ValueError:
        name = f"signal {ev.exit_signal}"
    return Diagnosis(AttemptClass.KILLED, f"killed by {name} with no OOM record", _excerpt(text))


# In this order: the first that recognises the evidence decides (a notice outranks the VM being gone, a
# live process outranks any text, a clean exit outranks an OOM line in the log).
_CHECKS: tuple[Callable[[Evidence, str], Diagnosis | None], ...] = (
    _from_resume, _from_notice, _from_vm_gone, _from_live_process, _from_missing_exit, _from_clean_exit,
    _from_memory, _from_storage, _from_comm, _from_signal,
)


def classify(ev: Evidence) -> Diagnosis:
    text = f"{ev.error_text}\n{ev.log_tail}"
    for check in _CHECKS:
        if (found := check(ev, text)) is not None:
            return found
    return Diagnosis(AttemptClass.USER_ERROR, f"exit {ev.exit_code}", _excerpt(ev.error_text or ev.log_tail))

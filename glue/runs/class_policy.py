"""The attempt classes and what each one allows, in one table: the policy text shown to the user, what
`glue recover` refuses, whether `--keep-failed` may keep the VMs, what `glue advise` counts as a failure
and what `glue watch` does. Those commands derive their rules from POLICIES, so a new class cannot be
handled by one of them and forgotten by another (tests/unit/test_class_policy.py checks every class has
one). The enum lives here rather than in glue.runs.classify so that classify's Diagnosis can read the
table without an import cycle. docs/design.md, section 6 "Failure classes and policies".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class AttemptClass(StrEnum):
    """What an attempt is: still running, completed, or one failure class. An attempt record keeps the
    failure members under `failure_class` (and `outcome: completed` at the end); never RUNNING."""

    RUNNING = "running"
    COMPLETED = "completed"
    OOM_GPU = "oom_gpu"
    OOM_HOST = "oom_host"
    STALL = "stall"
    COMM = "comm"
    VM_LOST = "vm_lost"
    PREEMPTED = "preempted"  # announced for termination (saved at the notice), or a spot VM reclaimed unannounced
    CAPPED = "capped"  # a serverless execution saved and stopped before its run-time cap: the next one continues
    BAD_RESTART = "bad_restart"
    EXPORT_MISSING = "export_missing"
    STORAGE_LOST = "storage_lost"  # the bucket mount died, or the bucket stopped answering past retries
    KILLED = "killed"  # killed by a signal from outside with no OOM record (preemption, operator)
    USER_ERROR = "user_error"

    @property
    def is_failure(self) -> bool:
        return self not in (AttemptClass.RUNNING, AttemptClass.COMPLETED)


# The reason `glue stop` records on the attempt it ends (class killed): the user ended it on purpose, so
# no watcher recovers it and `glue down` does not wait for its outputs.
STOPPED_ON_REQUEST = "stopped on request (glue stop)"

Budget = Literal["preemptions", "failures"]
StopEvent = Literal["oom", "bad_restart", "failed"]
# What `glue watch` does with the class: nothing (running), done (completed), recover from a budget,
# continue in the next execution from no budget (capped), or stop with that notification event.
Watch = Literal["none", "done", "preemptions", "failures", "continue", "oom", "bad_restart", "failed"]


@dataclass(frozen=True)
class ClassPolicy:
    """What one attempt class allows. The message templates take {run} (the run id); refuse_always also
    takes {reason} (the diagnosis' reason) and {missing} (the reason after its first ': ')."""

    watch: Watch
    text: str = ""  # Diagnosis.policy: what to do, shown by `glue status` and kept in the incident
    recoverable: bool = False  # an unplanned failure a restart repairs: `glue advise` counts it for the MTBF
    refuse_always: str | None = None  # `glue recover` has nothing to do, --force or not
    refuse_without_force: str | None = None  # a restart would not repair it: `glue recover` needs --force
    keepable: bool = False  # the VMs still work: `glue recover --keep-failed` may keep them for debugging

    @property
    def budget(self) -> Budget | None:
        """The watcher's budget a recovery of this class takes from; None: it takes none."""
        if self.watch == "preemptions" or self.watch == "failures":
            return self.watch
        return None

    @property
    def stop_event(self) -> StopEvent | None:
        """The notification the watcher sends when it stops on this class; None: it does not stop on it."""
        if self.watch == "oom" or self.watch == "bad_restart" or self.watch == "failed":
            return self.watch
        return None


_OOM_TEXT = "no blind restart: it repeats at this input; investigate with `glue memprobe`"
# {memprobe}: the memprobe command that works for the run (glue/runs/memprobe_hint.py), filled in by recover.
_OOM_REFUSAL = ("restarting does not repair a repeatable memory failure; investigate with "
                "{memprobe} and change the input, or pass --force")

POLICIES: dict[AttemptClass, ClassPolicy] = {
    AttemptClass.RUNNING: ClassPolicy(
        "none", refuse_always="run {run} is healthy ({reason}); nothing to recover"),
    AttemptClass.COMPLETED: ClassPolicy(
        "done", refuse_always="run {run} completed; nothing to recover"),
    AttemptClass.OOM_GPU: ClassPolicy("oom", _OOM_TEXT, refuse_without_force=_OOM_REFUSAL),
    AttemptClass.OOM_HOST: ClassPolicy("oom", _OOM_TEXT, refuse_without_force=_OOM_REFUSAL),
    AttemptClass.STALL: ClassPolicy(
        "failures", "kill the stuck process and recover (`glue recover`)", recoverable=True, keepable=True),
    AttemptClass.COMM: ClassPolicy(
        "failures", "restart the whole group and recover (`glue recover`)", recoverable=True, keepable=True),
    AttemptClass.VM_LOST: ClassPolicy("preemptions", "recover onto a new VM (`glue recover`)", recoverable=True),
    AttemptClass.PREEMPTED: ClassPolicy(
        "preemptions", "recover onto a new VM (`glue recover`); the checkpoint at the notice makes it cheap",
        recoverable=True),
    # Chaining executions past a run-time cap is the plan, not a failure: no budget, and no MTBF count.
    AttemptClass.CAPPED: ClassPolicy(
        "continue", "continue in a new execution from the checkpoint saved before the cap (`glue recover`; "
                    "`glue watch` does it from no budget)"),
    AttemptClass.BAD_RESTART: ClassPolicy(
        "bad_restart", "stop; the resume is wrong; keep the evidence and fix the trainer",
        refuse_without_force="the last resume was wrong; fix the trainer (see `glue incidents --run {run}`), "
                             "or pass --force"),
    AttemptClass.EXPORT_MISSING: ClassPolicy(
        "failed", "not done: write the required outputs; the VM is kept",
        refuse_always="run {run} finished, but required outputs are missing from the bucket ({missing}); "
                      "a restart does not fix that: export them"),
    AttemptClass.STORAGE_LOST: ClassPolicy(
        "failures", "infrastructure, not the trainer: `glue recover` resumes it on a VM with a live bucket mount",
        recoverable=True, keepable=True),
    AttemptClass.KILLED: ClassPolicy(
        "failures", "recover (`glue recover`); find out who sent the signal", recoverable=True, keepable=True),
    AttemptClass.USER_ERROR: ClassPolicy(
        "failed", "no automatic retry: fix the error in the traceback", keepable=True,
        refuse_without_force="the trainer failed with an error of its own (see `glue incidents --run {run}`); "
                             "fix it, or pass --force"),
}


def policy_of(cls: AttemptClass) -> ClassPolicy:
    return POLICIES[cls]

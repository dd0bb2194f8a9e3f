"""Losing the Slurm head loses no run. slurmctld's state (the queue) lives on the head VM's disk and goes with
it; the head `glue up` re-creates runs a fresh slurmctld that knows no job. The bucket still has every run's
records: the manifest (the run config, the pinned code and requirements, the `scheduler` record with the
job's sbatch options and the head it was submitted to) and the attempts. From them a run whose job the new
controller does not know is resubmitted:

- decide: the job was lost with the head only when the head is not the one it was submitted to (its VM id
  differs); a run that ended (completed, its own failure, `glue stop`) stays ended; a run that never
  started is submitted as a fresh start; one that was running is submitted as its next attempt, resumed
  from the newest valid checkpoint, and its restart judged like any Slurm restart (requeue.settle);
- resubmit: every secret must be in this shell's environment (one line naming a missing one, nothing
  submitted); the old trainer, where its node survived, is stopped first (the new controller would kill
  it as an orphan anyway; two trainers must never write one run); the new job id goes into the manifest's
  `scheduler` record, the earlier ones kept in its `history`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.runs import config as runconfig
from glue.runs import lease, monitor, remote
from glue.runs.attempt import check_command
from glue.runs.class_policy import AttemptClass
from glue.runs.records import AttemptRecord, Manifest
from glue.runs.store import RunStore, utc_iso
from glue.scheduler.slurm import queue
from glue.scheduler.slurm.batch import BatchScript, SbatchOptions
from glue.scheduler.slurm.nodes import head, node_states
from glue.scheduler.slurm.submit import check_fits, job_spec, submit_job
from glue.shell_secrets import from_shell
from glue.train import trainer_vars as V
from glue.train.run.notice import PREEMPTED_EXIT
from glue.workdir.pin import Workspace

# How an attempt ends when its job is lost rather than ending on its own: a restart repairs these. `killed`
# (a signal from outside) too: the new controller kills a lost job's trainer as an orphan; `glue stop`'s
# kill is told apart by the scheduler record's cancelled_at.
LOST_CLASSES = (str(AttemptClass.VM_LOST), str(AttemptClass.PREEMPTED), str(AttemptClass.KILLED))
STOP_WAIT_S = 30


@dataclass(frozen=True)
class Decision:
    """What to do with a run whose job the controller does not know: `ended` (leave it), `fresh` (submit it
    as it was: it never started) or `resume` (submit its next attempt, resumed); `why` in words."""

    action: str
    why: str

    @property
    def submits(self) -> bool:
        return self.action in ("fresh", "resume")


def controller_is_new(sched: dict[str, Any], head_id: str | None, head_replaced: bool) -> bool:
    """Whether the job was submitted to a slurmctld that is gone: the head's VM is not the one the job was
    submitted to. A record from before glue kept the head's id: only when this pass replaced the head."""
    recorded = sched.get("head_vm_id")
    return recorded != head_id if recorded else head_replaced


def decide(sched: dict[str, Any], head_id: str | None, latest: AttemptRecord | None,
           exit_rec: dict[str, Any] | None, head_replaced: bool = False) -> Decision:
    """The resubmission decision for a run whose job `sched` the controller does not know (pure: the unit
    tests drive it). `latest` is the run's latest attempt and `exit_rec` its exit record."""
    if not controller_is_new(sched, head_id, head_replaced):
        return Decision("ended", "Slurm forgot the job after it ended")
    if sched.get("cancelled_at"):
        return Decision("ended", "cancelled by `glue stop`")
    if latest is None:
        return Decision("fresh", "it was queued and never started")
    code = (exit_rec or {}).get("exit_code")
    if latest.outcome == str(AttemptClass.COMPLETED) or code == 0:
        return Decision("ended", "it completed")
    if latest.failure_class and latest.failure_class not in LOST_CLASSES:
        return Decision("ended", f"its attempt {latest.attempt} ended {latest.failure_class}; a job's own failure "
                                 "is not resubmitted blindly")
    if code is not None and code != PREEMPTED_EXIT:
        return Decision("ended", f"its attempt {latest.attempt} exited {code}; a job's own failure is not "
                                 "resubmitted blindly")
    if (exit_rec or {}).get("oom_kills"):
        return Decision("ended", f"its attempt {latest.attempt} was killed out of memory")
    return Decision("resume", f"attempt {latest.attempt} was lost with the head's queue")


def missing_secret(run: str, rc: runconfig.RunConfig) -> None:
    """One line naming the secrets this shell lacks: the job's environment carries them."""
    from_shell(rc.secrets, f"run `glue recover --run {run}` again (nothing submitted: the resubmitted job "
                           "carries the secrets)")


def stop_stale(home: Path, latest: AttemptRecord) -> None:
    """The lost attempt's trainer, where its node's VM survived the head: stopped (SIGTERM: a pending save
    is flushed) before the run is resubmitted."""
    pid = latest.trainer_pid
    host = current.host_of_node(home, latest)
    if not pid or host is None or host.id != latest.vm_id or not ssh.reachable(home, host):
        return
    # Only that very trainer (its environment names the run's attempt), never a process that took its pid.
    env = f"tr '\\0' '\\n' </proc/{pid}/environ 2>/dev/null"
    mine = " && ".join(f"{env} | grep -qx {shlex.quote(f'{var}={value}')}"
                       for var, value in ((V.RUN, latest.run), (V.ATTEMPT, latest.attempt))) + " || exit 0"
    wait = f"for i in $(seq {STOP_WAIT_S * 5}); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.2; done"
    ssh.run(home, host, f"{mine}; kill -TERM {pid} 2>/dev/null || exit 0; {wait}; kill -KILL {pid}; true",
            timeout=STOP_WAIT_S + 15)


def _record(sched: dict[str, Any], job_id: str, head_id: str, why: str) -> dict[str, Any]:
    """The manifest's scheduler record with the new job; the earlier ones kept, oldest first."""
    past = {k: sched.get(k) for k in ("job_id", "submitted_at", "head_vm_id")}
    history = [*list(sched.get("history") or []), {**past, "lost": why}]
    return {**sched, "job_id": job_id, "submitted_at": utc_iso(), "head_vm_id": head_id, "history": history}


def resubmit(home: Path, store: RunStore, sched: dict[str, Any], decision: Decision, console: Console) -> str:
    """Submit the run again from its records (decision fresh or resume), under the run's lease: a watcher
    and a `glue recover` never both resubmit it. Returns the one line saying so."""
    with lease.held(store, "resubmit"):
        manifest = store.read_manifest()
        now = manifest.scheduler or {}
        if now.get("job_id") != sched.get("job_id"):  # another process resubmitted it meanwhile
            return f"run {store.run} was resubmitted as job {now.get('job_id')} meanwhile"
        return _submit(home, store, manifest, decision, console)


def _submit(home: Path, store: RunStore, manifest: Manifest, decision: Decision, console: Console) -> str:
    rc = runconfig.parse(manifest.config, store.run, store.info.name)
    missing_secret(store.run, rc)
    host = head(home)
    options = SbatchOptions.of(store.run, rc.resources)
    check_fits(options, node_states(home))
    ws = Workspace.from_manifest(manifest)
    argv = check_command(home, host, rc, ws)
    latest = store.latest_attempt()
    resume = decision.action == "resume" and latest is not None
    if resume and latest is not None:
        stop_stale(home, latest)
    ckpt = monitor.last_valid_checkpoint(store, manifest) if resume else None
    first = max(store.attempts(), default=0) + 1
    limit = latest.memory_limit_mb if latest else None
    spec = job_spec(home, store, rc, host, argv, ws, memory_limit_mb=limit, first_attempt=first, resume=resume)
    script = BatchScript(store.run, options, remote.python(host)).render()
    job_id = submit_job(home, host, store.run, spec, script)
    manifest.scheduler = _record(manifest.scheduler or {}, job_id, host.id, decision.why)
    try:
        store.put_manifest(manifest)
    except GlueError:
        queue.cancel(home, job_id, store.run)  # no job runs for a run whose records do not name it
        raise
    start = f"resumes from step {ckpt}" if ckpt is not None else \
        "starts from step 0" + (" (no valid checkpoint)" if resume else " (it never started)")
    said = f"head {host.name} lost: replaced; run {store.run} resubmitted as job {job_id}, {start}"
    console.print(said, highlight=False, soft_wrap=True)
    return said


__all__ = ["Decision", "decide", "resubmit"]

"""`glue recover` and `glue watch` on a run under Slurm. Slurm restarts the run's job itself (requeued when
its node is lost, or after the notice's save); glue must never start an attempt beside it, which would
train the run twice and hold a GPU Slurm gave to another job. What glue does instead:
- replaces the VMs of lost nodes by `glue up`'s path (Terraform, then Ansible): each rejoins the
  partition under its name, so the cluster gets its GPUs back;
- judges every restart's resume as it judges a recovery (glue.scheduler.slurm.requeue.settle: first
  resumed step = checkpoint + 1, equal losses; a restart from step 0 is a bad_restart);
- says where the job stands. A job that ended on its own failure (OOM, crash) is not resubmitted:
  never requeued blindly;
- when the head itself is lost (slurmctld's queue on its disk), replaces it first and resubmits a run its
  new controller does not know from the bucket's records (glue.scheduler.slurm.resubmit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cluster import current
from glue.errors import GlueError
from glue.operations import lifecycle
from glue.runs import lease
from glue.runs.records import RecoveryRecord
from glue.runs.store import RunStore
from glue.scheduler.slurm import jobs, nodes, queue, requeue, resubmit

# squeue states of a job Slurm still holds; RUNNING ones train (or are about to), the rest wait.
RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
REQUEUE_WAIT_S = 15.0  # a job on a node marked DOWN is requeued within a second or two


@dataclass(frozen=True)
class SlurmTake:
    """What glue found and did for a Slurm run: `state` is the watcher's (running, waiting, completed,
    stopped), `note` one line for the user."""

    state: str
    note: str
    replaced: tuple[str, ...] = ()


def is_slurm_run(store: RunStore) -> bool:
    return jobs.job_of(store.read_manifest()) is not None


def lost_vms(home: Path) -> list[str]:
    """The cluster's VMs the backend no longer has (their nodes are down in Slurm)."""
    backend = current.backend(home)
    return [h.name for h in current.all_hosts(home) if backend.read_vm(h.id) is None]


def _judged(store: RunStore, home: Path) -> str:
    found = requeue.settle(home, store)
    if not found:
        return ""
    last = RecoveryRecord.from_dict(found[-1])
    verdict = "verified" if last.verified else last.failure_class or "not verified"
    return f"; restart {last.new_attempt} resumed from step {last.checkpoint_step}: {verdict}"


def _ended(store: RunStore, sched: dict[str, Any], job_id: str, queued: dict[str, queue.Job]) -> SlurmTake:
    row = jobs.run_row(store, sched, queued)
    ended = str(row.get("ended") or "")
    if ended in ("completed", "exited 0"):
        return SlurmTake("completed", f"Slurm job {job_id} ended: completed")
    return SlurmTake("stopped", f"Slurm job {job_id} ended ({ended or 'no exit recorded'}); a job's own failure "
                                f"is not requeued: see `glue status --run {store.run}`, fix it and deploy it again")


def _hasten(home: Path, lost: list[str], job: queue.Job) -> queue.Job:
    """The lost nodes DOWN now, and the run's job, once requeued, free to start at once: Slurm alone waits
    SlurmdTimeout, then the credential's lifetime (docs/slurm.md). Returns the job as it stands after."""
    try:  # an optimisation: Slurm gets there by itself when a command here fails
        down = {n for n in lost if n in _node_names(home)}
        if down:
            queue.mark_down(home, sorted(down), "gpukit: VM lost")
        deadline = time.monotonic() + REQUEUE_WAIT_S
        while job.state in RUNNING_STATES and set(job.nodes.split(",")) & down and time.monotonic() < deadline:
            time.sleep(0.5)
            job = queue.job(home, job.job_id) or job
        if job.state == "PENDING" and job.reason == "BeginTime":
            queue.start_now(home, job.job_id)
    except GlueError:
        pass
    return job


def _node_names(home: Path) -> set[str]:
    return {n.name for n in nodes.node_states(home)}


def _own_job(queued: dict[str, queue.Job], job_id: str, run: str) -> queue.Job | None:
    """The run's job in the queue: its id and its name (a new controller numbers jobs from 1 again)."""
    job = queued.get(job_id)
    return job if job is not None and job.run == run else None


def _head_name(home: Path) -> str:
    return current.ClusterConfig.load(home).vm_names()[0]


def _replace_head(home: Path, store: RunStore, console: Console, lost: list[str]) -> None:
    others = [name for name in lost if name != _head_name(home)]
    also = f" (and node(s) {', '.join(others)})" if others else ""
    console.print(f"[bold]{store.run}[/]: the Slurm head {_head_name(home)}{also} lost (slurmctld's queue went "
                  "with it); replacing the VM(s), then resubmitting what the queue held from the bucket")
    lifecycle.up(home, current.ClusterConfig.load(home), console)


def _unknown(home: Path, store: RunStore, sched: dict[str, Any], queued: dict[str, queue.Job],
             head_replaced: bool, console: Console, replace: bool) -> SlurmTake:
    """The controller does not know the run's job: it ended (Slurm forgot it), or it was lost with the head's
    queue: then resubmitted from the run's records (glue.scheduler.slurm.resubmit)."""
    latest = store.latest_attempt()
    exit_rec = store.exit_record(latest.attempt, 0) if latest else None
    decision = resubmit.decide(sched, nodes.head(home).id, latest, exit_rec, head_replaced)
    if not decision.submits:
        return _ended(store, sched, str(sched.get("job_id")), queued)
    if not replace:
        return SlurmTake("waiting", f"Slurm job {sched.get('job_id')} was lost with the head's queue "
                                    f"({decision.why}); `glue recover --run {store.run}` resubmits it")
    said = resubmit.resubmit(home, store, sched, decision, console)
    return SlurmTake("waiting", said)


def take(home: Path, store: RunStore, console: Console, replace: bool = True) -> SlurmTake:
    """Judge the run's restarts, replace lost nodes' VMs (replace=False: only name them), and say where the
    job stands. A lost head is replaced first, and a job its new controller does not know resubmitted from
    the bucket's records."""
    sched = jobs.job_of(store.read_manifest())
    if sched is None:
        raise GlueError(f"run {store.run} was not submitted to Slurm")
    job_id = str(sched.get("job_id"))
    judged = _judged(store, home)
    lost = lost_vms(home)
    head_lost = _head_name(home) in lost
    if head_lost and not replace:
        return SlurmTake("waiting", f"the Slurm head {_head_name(home)} is lost; `glue recover --run {store.run}` "
                                    "replaces it and resubmits the run")
    replaced = tuple(lost) if head_lost else ()
    if head_lost:
        _replace_head(home, store, console, lost)
        lost = []
    queued = {j.job_id: j for j in queue.jobs(home)}
    job = _own_job(queued, job_id, store.run)
    if lost and replace:  # whether or not its job is still Slurm's: the restart may have ended by now
        job = _hasten(home, lost, job) if job is not None else None
        console.print(f"[bold]{store.run}[/]: node(s) {', '.join(lost)} lost; replacing their VMs (they rejoin "
                      "Slurm's partition under their names)")
        lifecycle.up(home, current.ClusterConfig.load(home), console)
    if job is None:
        taken = _unknown(home, store, sched, queued, head_lost, console, replace)
        return SlurmTake(taken.state, taken.note + judged, replaced or (tuple(lost) if replace else ()))
    where = f" on {job.nodes}" if job.nodes else ""
    why = f" ({job.reason})" if job.reason and job.reason != "None" else ""
    note = f"Slurm job {job_id} {job.state}{where}{why}; Slurm restarts it, glue checks each restart's resume"
    if lost:
        note += f"; {'replaced' if replace else 'lost'}: {', '.join(lost)}"
    state = "running" if job.state in RUNNING_STATES else "waiting"
    return SlurmTake(state, note + judged, tuple(lost) if replace else ())


def recover(home: Path, run_id: str, console: Console) -> SlurmTake:
    """`glue recover --run X` of a Slurm run, under the run's lease (one writer, as any recovery)."""
    store = RunStore.open(home, run_id)
    with lease.held(store, "recover"):
        taken = take(home, store, console)
    if taken.state == "stopped":
        raise GlueError(f"run {run_id}: {taken.note}")
    return taken

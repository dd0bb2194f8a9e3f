"""A run's Slurm job as the run's records and Slurm's queue tell it: the queue view `glue status` shows
(each run's job id, Slurm state, pending reason, latest attempt; the cluster's GPUs in use and free),
`glue stop` (scancel) and the job's own output on its node (`glue logs --job-output`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.runs import records
from glue.runs.records import AttemptRecord, Manifest
from glue.runs.store import RunStore, all_run_ids, utc_iso
from glue.scheduler.slurm import queue, requeue, resubmit
from glue.scheduler.slurm.batch import gpus_of
from glue.scheduler.slurm.nodes import head, node_states
from glue.train.run.slurm_job import output_file


def on_slurm(home: Path) -> bool:
    """Whether the cluster was brought up with `glue up --scheduler slurm`."""
    try:
        return current.ClusterConfig.load(home).scheduler == "slurm"
    except GlueError:
        return False


def job_of(manifest: Manifest) -> dict[str, Any] | None:
    """The run's `scheduler` record (job id, sbatch options) when it was submitted to Slurm."""
    sched = manifest.scheduler
    return sched if isinstance(sched, dict) and sched.get("name") == "slurm" else None


def _latest(store: RunStore) -> AttemptRecord | None:
    return store.latest_attempt()


def run_row(store: RunStore, sched: dict[str, Any], queued: dict[str, queue.Job], *,
            head_id: str | None = None) -> dict[str, Any]:
    """One run of the queue view: its job as squeue has it now (ENDED once Slurm forgot it; LOST when it went
    with a lost head's queue and glue will resubmit it, `head_id` given), and what its latest attempt
    recorded (the node, the GPUs it was given, how it ended)."""
    job_id = str(sched.get("job_id"))
    job = queued.get(job_id)
    job = job if job is not None and job.run == store.run else None  # a new head numbers jobs from 1 again
    last = _latest(store)
    slurm = (last.scheduler if last else None) or {}
    ended = last and (last.failure_class or last.outcome)
    exit_rec = store.exit_record(last.attempt, 0) if last and not ended else None
    if exit_rec is not None:
        ended = "exited 0" if exit_rec.get("exit_code") == 0 else f"exited {exit_rec.get('exit_code')}"
    state, reason = (job.state, job.reason) if job else ("ENDED", "")
    if job is None and head_id and resubmit.decide(sched, head_id, last, exit_rec).submits:
        state, reason = "LOST", f"with the head's queue; `glue recover --run {store.run}` resubmits it"
    return {"run": store.run, "job_id": job_id, "state": state, "reason": reason,
            "nodes": job.nodes if job else (last.vm if last else "") or "",
            "attempt": last.attempt if last else None, "cuda_visible_devices": slurm.get("cuda_visible_devices"),
            "restart_count": slurm.get("restart_count"), "ended": ended}


def queue_view(home: Path) -> dict[str, Any]:
    """The Slurm part of `glue status`: {"gpus": {total, used, free}, "runs": [run_row...]}; {"error": line}
    when slurmctld does not answer."""
    try:
        nodes = node_states(home)
        queued = {j.job_id: j for j in queue.jobs(home)}
        head_id = head(home).id
    except GlueError as exc:
        return {"error": str(exc)}
    # Counted from sinfo's GRES and squeue's requests: scontrol's CfgTRES/AllocTRES name GPUs only where
    # slurm.conf's AccountingStorageTRES lists gres/gpu.
    total = sum(gpus_of(n.gres) for n in nodes if n.in_service)
    used = sum(queue.gpus_held(j) for j in queued.values())
    rows = []
    for run in all_run_ids(home):
        store = RunStore.open(home, run)
        try:
            sched = job_of(store.read_manifest())
        except GlueError:
            continue  # a run whose manifest is not there (yet) is no Slurm run to show
        if sched is not None:
            requeue.settle(home, store)  # a restart that has run far enough: its resume checked and recorded
            rows.append(run_row(store, sched, queued, head_id=head_id))
    return {"gpus": {"total": total, "used": used, "free": max(total - used, 0)}, "runs": rows}


def stop(home: Path, run: str) -> str:
    """scancel the run's job (pending or running: never requeued after), then record its attempt killed as
    `glue stop` does for any run."""
    from glue.watch.stop_run import stop_run

    store = RunStore.open(home, run)
    sched = job_of(store.read_manifest())
    if sched is None:
        raise GlueError(f"run {run} was not submitted to Slurm")
    job_id = str(sched["job_id"])
    job = queue.job(home, job_id)
    job = job if job is not None and job.run == run else None  # a new head numbers jobs from 1 again
    if job is None and not store.attempts():
        raise GlueError(f"run {run}: its job {job_id} is no longer in Slurm's queue and never started")
    if job is not None:
        queue.cancel(home, job_id, run)
    manifest = store.read_manifest()  # stopped: never resubmitted, should the head be lost later
    manifest.scheduler = {**sched, "cancelled_at": utc_iso()}
    store.put_manifest(manifest)
    if job is not None and not store.attempts():
        return f"run {run}: job {job_id} cancelled while {job.state.lower()} ({job.reason or 'no reason'}); " \
               "it never started"
    said = stop_run(home, run)
    return f"run {run}: job {job_id} cancelled (scancel); {said.split(': ', 1)[-1]}"


def job_output(home: Path, run: str) -> str:
    """The batch script's output on the node of the run's latest start (every (re)start appended)."""
    store = RunStore.open(home, run)
    sched = job_of(store.read_manifest())
    if sched is None:
        raise GlueError(f"run {run} was not submitted to Slurm (`glue logs --run {run}` shows its trainer's log)")
    last = _latest(store)
    if not last:
        raise GlueError(f"run {run}: job {sched['job_id']} has not started yet (`glue status` shows why it waits)")
    host = current.host_of_node(home, records.nodes_of(last)[0])
    if host is None:
        raise GlueError(f"run {run}: node {last.vm} of job {sched['job_id']} is no longer in the cluster; "
                        f"`glue logs --run {run}` shows the trainer's log from the bucket")
    res = ssh.run(home, host, f"cat {shlex.quote(output_file(run, str(sched['job_id'])))}", timeout=30)
    if res.exit_code != 0:
        raise GlueError(f"run {run}: no job output on {host.name} ({res.stderr.strip()[:200]})")
    return res.stdout

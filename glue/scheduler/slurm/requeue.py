"""A requeued Slurm job's resume, checked exactly like a recovery's (glue.operations.recovery.resume_check):
the first step the restarted job ran must be the checkpoint it could resume from + 1, and its losses must
equal the earlier attempts' at every step both ran. Slurm restarts the job by itself (after the notice's
save and `scontrol requeue`, or when its node was lost); glue checks the restart once the new attempt has
run past the old one's last step (or ended), and records it as a recovery of the run. A restart from step
0 while a valid checkpoint existed is a `bad_restart`: its trainer is stopped, the job cancelled (never
requeued again), its checkpoints marked rejected, an incident recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.operations.recovery import phases
from glue.operations.recovery.resume_check import ResumeCheck, check_all_ranks, merged_metrics
from glue.runs import monitor
from glue.runs.classify import AttemptClass
from glue.runs.records import Manifest, RecoveryRecord
from glue.runs.store import RunStore, parse_iso, utc_iso
from glue.scheduler.slurm import queue
from glue.train.run.notice import PREEMPTED_EXIT

TOLERANCE = 0.0  # the same node type, CPU or one GPU each: the resumed losses are bitwise equal


def newest_valid_before(store: RunStore, manifest: Manifest, started_at: str) -> int | None:
    """The newest valid checkpoint committed before the restart began: the one it had to resume from."""
    from glue.train.checkpoint.format import check_checkpoints  # the storage layer: only when needed

    storage = monitor.checkpoint_storage(store, manifest)
    if storage is None:
        return None
    since = parse_iso(started_at)
    steps = [st.step for st in check_checkpoints(storage, deep=False)
             if st.valid and st.commit is not None and parse_iso(st.commit.created_at) < since]
    return max(steps, default=None)


def _why_ended(store: RunStore, n: int, nodes: int, resubmitted: bool = False) -> tuple[str, str]:
    """How the attempt before a restart ended: saved on the notice (preempted), lost with a node (one of its
    `nodes` left no exit record: its supervisor went down with it; Slurm killed the others' steps), or lost with
    the head's queue (glue resubmitted the run as a new job)."""
    ends = [store.exit_record(n, k) for k in range(nodes)]
    lost = [k for k, e in enumerate(ends) if e is None]
    if not lost and any(e is not None and e.get("exit_code") == PREEMPTED_EXIT for e in ends):
        return str(AttemptClass.PREEMPTED), "saved on Slurm's notice (USR1) and requeued"
    if resubmitted:
        return str(AttemptClass.VM_LOST), "its job was lost with the Slurm head's queue; glue resubmitted the run"
    if lost:
        which = "its node" if nodes == 1 else f"node {', '.join(map(str, lost))} of its {nodes}"
        return str(AttemptClass.VM_LOST), f"{which} was lost; Slurm requeued the job"
    return str(AttemptClass.KILLED), f"ended with exit {ends[0].get('exit_code') if ends[0] else None}; " \
                                     "Slurm requeued the job"


def _world_size(manifest: Manifest, nodes: int) -> int:
    """The ranks of a start: one on a single node (the command runs as it is), nodes x gpus_per_node under
    torchrun on several (glue.train.run.slurm_job)."""
    if nodes <= 1:
        return 1
    resources = manifest.config.get("resources") or {}
    return nodes * int(resources.get("gpus_per_node") or 1)


def _ready(store: RunStore, n: int, old: dict[int, Any], new: dict[int, Any]) -> bool:
    """The restart has run past the old attempt's last step, or ended: its resume can be judged whole."""
    return bool(new) and (max(new) >= max(old, default=0) or store.exit_record(n, 0) is not None)


def check_restart(home: Path, store: RunStore, manifest: Manifest, n: int) -> dict[str, Any] | None:
    """Attempt n (a Slurm restart) against the attempts before it; its recovery record once judged, else None."""
    rec, prev = store.read_attempt(n), store.read_attempt(n - 1)
    old, new = merged_metrics(store, n), store.metrics(0).get(n, {})
    if rec is None or prev is None or not _ready(store, n, old, new):
        return None
    sched = rec.scheduler or {}
    # The node read it before the trainer started; a record without it: the commits before the restart.
    ckpt = sched["resume_from"] if "resume_from" in sched else \
        newest_valid_before(store, manifest, rec.started_at)
    upto = min(max(old, default=0), max(new))
    world = _world_size(manifest, len(rec.nodes))
    # Every rank continues exactly, as a recovery's check asks of a group (rank 0's steps, then each other's).
    check = check_all_ranks(store, old, new, failed_attempt=n - 1, new_attempt=n, world_size=world, ckpt=ckpt,
                            upto=upto, tolerance=TOLERANCE, finished_before=False)
    resubmitted = not sched.get("restart_count")  # a new job's first start: glue resubmitted it (the head lost)
    failure, reason = _why_ended(store, n - 1, max(len(prev.nodes), 1), resubmitted)
    if not prev.ended:
        prev.update(failure_class=failure, reason=reason, ended_at=prev.ended_at or rec.started_at)
        store.put_attempt(prev)
    record = RecoveryRecord(
        run=store.run, failed_attempt=n - 1, new_attempt=n, failure_class=failure,
        old_vm={"name": prev.vm, "id": prev.vm_id},
        new_vm={"name": rec.vm, "id": rec.vm_id},
        nodes=[nd.to_dict() for nd in rec.nodes], dropped_vms=[], world_size=world,
        resume_check={"kind": "exact", "by": "slurm resubmission" if resubmitted else "slurm requeue"},
        rendezvous=None, checkpoint_step=ckpt,
        failure_step=max(old, default=0), seconds={}, work_lost={"steps": max(old, default=0) - (ckpt or 0)},
        verified=check.ok, first_resumed_step=check.first_step, compared_steps=check.compared, problem=check.problem,
        tolerance=TOLERANCE, scheduler={"job_id": sched.get("job_id"),
                                                      "restart_count": sched.get("restart_count"),
                                                      "nodelist": sched.get("nodelist")})
    if not check.ok:
        _bad_restart(home, store, manifest, n, check, str(sched.get("job_id") or ""))
        record.bad_restart = True
    store.add_recovery(record)
    return record.to_dict()


def _bad_restart(home: Path, store: RunStore, manifest: Manifest, n: int, check: ResumeCheck,
                 job_id: str) -> None:
    """Loudly: the job cancelled (Slurm must not start the wrong trajectory again), the attempt stopped and
    classed bad_restart, its checkpoints rejected, the incident recorded."""
    if job_id:
        try:
            queue.cancel(home, job_id, store.run)
        except GlueError:
            pass  # the head does not answer: the trainer is still stopped below
    phases.flag_bad_restart(home, store, manifest, n, check)
    rec = store.read_attempt(n)
    if rec is not None:
        rec.update(failure_class=str(AttemptClass.BAD_RESTART), reason=f"Slurm restart: {check.problem}",
                   ended_at=utc_iso())
        store.put_attempt(rec)


def settle(home: Path, store: RunStore) -> list[dict[str, Any]]:
    """Every Slurm restart of the run not yet judged, judged now (when it has run far enough). Returns the
    recovery records written."""
    attempts = store.attempts()
    if len(attempts) < 2:
        return []
    judged = {r.new_attempt for r in store.read_recoveries()}
    manifest = store.read_manifest()
    done = []
    for n in attempts[1:]:
        rec = store.read_attempt(n)
        sched = (rec.scheduler if rec else None) or {}
        if n in judged or not sched:  # every later Slurm start: a requeue, or a resubmission after a lost head
            continue
        found = check_restart(home, store, manifest, n)
        if found is not None:
            done.append(found)
    return done

"""`glue recover`: move a failed run onto a newly provisioned VM and prove the resume is exact.

Phases, one function each in glue/operations/recovery/phases.py (timed into runs/<run>/recoveries/<n>.json):
  detect     last sign of life of the failed attempt -> failure classified
  validate   the checkpoints in the bucket checked from the controller (sizes, sha256)
  provision  terraform replaces the VM (a lost VM is drift; a live one is -replace'd), or a warm spare takes
             its place; a live VM that another live run uses is left alone and the run moves to a free VM
             (glue/operations/recovery/neighbours.py)
  configure  the Ansible playbook on the new VM (bucket mount, trainer runtime)
  verify     boundary guard, checkpoint read back on the new VM, command present
  prepare    the run's code package and requirements from the bucket by the manifest's hashes, checked
             (only for a run with a workdir or requirements; begun alongside verify, timed as what it adds)
  start      the next attempt on the group's hosts, resuming
  restore    trainer start -> first resumed step (process start + checkpoint load + one step)
  replay     first resumed step -> the step the failed attempt had reached (work redone)
  check      the resume check (glue/operations/recovery/resume_check.py)
  record     the result into the bucket; a failed check stops the attempt as a bad restart
The check: first resumed step == checkpoint step + 1, and the losses of the first resumed steps equal
the pre-failure metrics at the same steps (exactly on CPU; --tolerance for GPU), on every rank.
A multi-node run (deploy --nodes N) is recovered as a group: the lost VMs are replaced, the live
ones kept, what is left of the attempt is killed on every node, and the group re-forms.
"""


from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from glue.errors import GlueError
from glue.operations import spares, warm_spares
from glue.operations.recovery import neighbours, phases, replay
from glue.operations.recovery.phases import Timings, secs_between
from glue.operations.recovery.resume_check import ResumeCheck, check_resume, merged_metrics, step_ranges
from glue.operations.recovery.resume_plan import ResumePlan
from glue.runs import lease, records, serverless, serverless_state
from glue.runs.records import AttemptRecord, Manifest, RecoveryRecord
from glue.runs.store import RunStore
from glue.runs.vm_group import GroupSpec

__all__ = ["check_resume", "merged_metrics", "print_table", "recover"]


class BadRestart(GlueError):
    """The recovery ran, but the resumed attempt failed the resume check (flagged bad_restart, stopped)."""

    def __init__(self, message: str, record: RecoveryRecord) -> None:
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class RecoverOptions:
    """How `glue recover` goes about it (its options; docs in `recover`)."""

    force: bool = False
    from_scratch: bool = False
    same_vm: bool = False
    verify_steps: int = 5
    tolerance: float = 0.0
    wait_timeout: float = 600.0
    keep_failed: bool = False
    shrink_to: int | None = None
    reshard_tolerance: float = 0.1


def recover(home: Path, run_id: str, console: Console, *, force: bool = False, from_scratch: bool = False,
            same_vm: bool = False, verify_steps: int = 5, tolerance: float = 0.0,
            wait_timeout: float = 600.0, keep_failed: bool = False,
            on_started: Callable[[ResumePlan], None] | None = None, nodes: int | None = None,
            reshard_tolerance: float = 0.1) -> RecoveryRecord:
    """keep_failed: a failed VM that is still alive (stall, comm, user_error) is left running, its
    attempt stopped (SIGSTOP) for debugging, and the run moves to a new VM (glue.operations.lifecycle.kept).
    on_started: called once the new attempt runs, with what its resume check needs (`plan`), so a
    caller that dies before the check (glue watch) can have it made later.
    nodes: continue a group on that many of its surviving VMs (fewer than it had), no VM provisioned; the
    checkpoint is restored at the smaller world size and the resume checked with check_resharded."""
    opts = RecoverOptions(force, from_scratch, same_vm, verify_steps, tolerance, wait_timeout, keep_failed, nodes,
                          reshard_tolerance)
    store = RunStore.open(home, run_id)
    manifest = store.read_manifest()  # unknown run -> one line
    with lease.held(store, "recover"):  # one writer: a second recover refuses, naming this one
        return Recovery(home, store, manifest, console, opts, on_started).run()


def recover_within(home: Path, run_id: str, console: Console, min_nodes: int | None,
                   **kwargs: Any) -> RecoveryRecord:
    """`glue watch`'s recovery: as `recover`; when that fails before a new attempt started (a lost VM
    that cannot be replaced: no capacity) and the run allows it (recovery.min_nodes), the run continues
    on its surviving VMs, if at least min_nodes of them are left."""
    started: list[ResumePlan] = []
    told = kwargs.pop("on_started", None)

    def on_started(plan: ResumePlan) -> None:
        started.append(plan)
        if told is not None:
            told(plan)

    try:
        return recover(home, run_id, console, on_started=on_started, **kwargs)
    except BadRestart:
        raise
    except GlueError as exc:
        if started or min_nodes is None:
            raise
        store = RunStore.open(home, run_id)
        attempt = store.latest_attempt()
        if attempt is None:
            raise
        total, live = len(records.nodes_of(attempt)), len(phases.alive(home, attempt))
        if not min_nodes <= live < total:
            raise
        console.print(f"[yellow]{run_id}[/]: {exc}; continuing on the {live} surviving of {total} VMs "
                      f"(recovery.min_nodes {min_nodes})")
        return recover(home, run_id, console, on_started=on_started, nodes=live, **kwargs)


@dataclass
class Moved:
    """Where the next attempt runs, and how it got there (provision .. start)."""

    hosts: list[Any]
    replaced: list[str]
    keep: list[Any]
    group: GroupSpec
    started: AttemptRecord
    configured: dict[str, str] = field(default_factory=dict)  # VM name -> spare | seed | playbook | unchanged
    spares_used: spares.SparesUsed = field(default_factory=dict)  # refilled once the run resumed (Recovery._replay)
    provisioned: bool = False


@dataclass
class Recovery:
    """One `glue recover` of a run, under its lease: the phases as named steps over the state they share."""

    home: Path
    store: RunStore
    manifest: Manifest
    console: Console
    opts: RecoverOptions
    on_started: Callable[[ResumePlan], None] | None = None
    timed: Timings = field(default_factory=Timings)

    def run(self) -> RecoveryRecord:
        with self.console.status("[bold]detect[/]: classifying the last attempt …"):
            failure = phases.detect(self.home, self.store, self.opts.force)
        with self.timed.phase(self.console, "validate", "checking the checkpoints in the bucket (sizes and sha256)"):
            lost = phases.validate(self.store, self.manifest, failure, self.opts.from_scratch)
        moved = self._move(failure, lost)
        if moved.group != lost.group:
            phases.record_group(self.store, self.manifest, moved.group, failure.number + 1)
        upto = max((lost.ckpt or 0) + self.opts.verify_steps, lost.failure_step)
        check = self._check_kind(lost, moved.group)
        if self.on_started is not None:
            self.on_started(plan(failure, lost, moved.started, upto, self.opts.tolerance, self.timed, check))
        new_metrics = self._replay(failure, lost, moved, upto)
        verdict = phases.check(self.store, lost, failure, new_metrics, upto, self.opts.tolerance, moved.group,
                               self.opts.reshard_tolerance)
        result = self._result(failure, lost, moved, new_metrics, verdict, check)
        return self._record(failure, result, verdict)

    def _move(self, failure: phases.Failure, lost: phases.Lost) -> Moved:
        """provision .. start: a serverless run continues in a new execution, any other on VMs."""
        if not serverless_state.is_serverless(failure.attempt):
            return _onto_vms(self.home, self.store, self.console, failure, lost, self.opts, self.timed)
        with self.timed.phase(self.console, "provision", "none: the run continues in a new Lyceum execution"):
            phases.kill_attempt(self.home, self.store, failure.attempt)
            started = serverless.start_execution(self.store, lost.rc, failure.number + 1, resume=True)
        return Moved([], [], [], lost.group, started)

    def _check_kind(self, lost: phases.Lost, group: GroupSpec) -> dict[str, Any]:
        resharded = group.world_size != lost.group.world_size
        tolerance = self.opts.tolerance
        return {"kind": "resharded" if resharded else "exact" if not tolerance else "tolerance",
                "world_size_before": lost.group.world_size, "world_size": group.world_size,
                "tolerance": self.opts.reshard_tolerance if resharded else tolerance}

    def _replay(self, failure: phases.Failure, lost: phases.Lost, moved: Moved, upto: int) -> dict[int, Any]:
        new_n = failure.number + 1
        try:
            with self.console.status(f"[bold]restore + replay[/]: waiting for attempt {new_n} to pass step {upto} …"):
                return replay.replay(self.store, new_n, upto, self.opts.wait_timeout, first=(lost.ckpt or 0) + 1)
        finally:
            # After the restore, which the refill's apply and playbook would slow. Also after a recovery that
            # took no spare: one found dead was re-created by its apply, and is configured by the refill.
            if moved.spares_used or (moved.provisioned and spares.wanted(self.home)):
                spares.start_refill(self.home)
                self.console.print("spare pool: refilling in the background (`glue status`; log: "
                                   f"{spares.log_path(self.home)})")

    def _seconds(self, failure: phases.Failure, lost: phases.Lost, started: AttemptRecord,
                 new_metrics: dict[int, Any]) -> dict[str, float | None]:
        ckpt, failure_step = lost.ckpt, lost.failure_step
        first_t = new_metrics[min(new_metrics)]["t"] if new_metrics else None
        reach_t = new_metrics.get(failure_step, {}).get("t")
        return {
            "detect": secs_between(failure.last_alive, failure.detected_at),
            **self.timed,
            "restore": secs_between(started.started_at, first_t),
            # Nothing to replay when the VM died right at its checkpoint; None = still replaying at the deadline.
            "replay": secs_between(first_t, reach_t) if reach_t else (0.0 if failure_step <= (ckpt or 0) else None),
        }

    def _result(self, failure: phases.Failure, lost: phases.Lost, moved: Moved, new_metrics: dict[int, Any],
                verdict: ResumeCheck, check: dict[str, Any]) -> RecoveryRecord:
        nodes, hosts, started = records.nodes_of(failure.attempt), moved.hosts, moved.started
        old, ckpt, failure_step = lost.old_metrics, lost.ckpt, lost.failure_step
        lost_s = secs_between(old.get(ckpt or 0, {}).get("t"), old.get(failure_step, {}).get("t")) \
            if ckpt else secs_between(failure.attempt.started_at, old.get(failure_step, {}).get("t"))
        kept_names = {h.name for h in hosts}
        lost_node = next((nd for nd in nodes if nd.vm in moved.replaced or nd.vm not in kept_names), nodes[0])
        new_host = next((h for h in hosts if h.name == lost_node.vm), hosts[0] if hosts else None)
        new_vm = {"name": new_host.name, "id": new_host.id} if new_host else \
            {"name": started.vm, "id": started.vm_id}
        spares_used = moved.spares_used
        if new_host and new_host.name in spares_used:
            new_vm["spare"] = spares_used[new_host.name]["spare"]  # it was this warm spare
        return RecoveryRecord(
            run=self.store.run, failed_attempt=failure.number, new_attempt=failure.number + 1,
            failure_class=str(failure.outcome), old_vm={"name": lost_node.vm, "id": lost_node.vm_id},
            new_vm=new_vm,
            nodes=[{"node": k, "vm": h.name, "old_id": nd.vm_id, "new_id": h.id,
                    "replaced": h.name in moved.replaced, "spare": (spares_used.get(h.name) or {}).get("spare"),
                    "configured": moved.configured.get(h.name, "kept"),
                    "trainer_start": warm_spares.trainer_start(started.nodes[k]) if k < len(started.nodes) else None}
                   for k, (nd, h) in enumerate(zip(nodes, hosts, strict=False))],
            dropped_vms=[nd.vm for nd in nodes if hosts and nd.vm not in kept_names],
            world_size=moved.group.world_size, resume_check=check, rendezvous=started.rendezvous,
            checkpoint_step=ckpt, failure_step=failure_step,
            seconds=self._seconds(failure, lost, started, new_metrics),
            work_lost={"steps": failure_step - (ckpt or 0), "seconds": lost_s},
            verified=verdict.ok, first_resumed_step=verdict.first_step, compared_steps=verdict.compared,
            problem=verdict.problem, tolerance=self.opts.tolerance,
            spares=[{"vm": name, **used} for name, used in sorted(spares_used.items())],
            kept_vm=moved.keep[0].as_dict() if moved.keep else None, kept_vms=[k.as_dict() for k in moved.keep])

    def _record(self, failure: phases.Failure, record: RecoveryRecord, verdict: ResumeCheck) -> RecoveryRecord:
        """Into the bucket and onto the console; a failed check stops the new attempt as a bad restart."""
        number = phases.record(self.store, record)
        print_table(self.console, record)
        if verdict.ok:
            return record
        run_id = self.store.run
        rejected, trouble = phases.flag_bad_restart(self.home, self.store, self.manifest, failure.number + 1, verdict)
        record.update(rejected_checkpoints=rejected, reject_problem=trouble)
        self.store.put_recovery(number, record)  # the record says which checkpoints the wrong resume had committed
        marked = f"; the checkpoint(s) it committed (step {', '.join(map(str, rejected))}) marked rejected" \
            if rejected else ""
        raise BadRestart(f"bad restart of run {run_id}: {verdict.problem}; the trainer was stopped{marked}"
                         f"{'; ' + trouble if trouble else ''} and the evidence kept (glue incidents --run {run_id})",
                         record)


def _onto_vms(home: Path, store: RunStore, console: Console, failure: phases.Failure, lost: phases.Lost,
              opts: RecoverOptions, timed: Timings) -> Moved:
    """provision, configure, verify, prepare, start: the next attempt on VMs (new ones for the lost)."""
    nodes, shrink_to = records.nodes_of(failure.attempt), opts.shrink_to
    group = lost.group
    keep: list[Any] = []
    spares_used: spares.SparesUsed = {}  # none on the survivors, nor with --same-vm
    if shrink_to is not None and shrink_to != len(nodes):
        group = replace(lost.group, nodes=shrink_to)
        with timed.phase(console, "provision", f"none: the run continues on {shrink_to} of its VMs"):
            hosts = phases.survivors(home, failure, shrink_to)  # refuses before anything is stopped
            phases.kill_attempt(home, store, failure.attempt)
        replaced: list[str] = []
        fresh = [hosts[0].name]  # the head reads the checkpoint back
        how: dict[str, str] = {}
    else:
        with timed.phase(console, "provision", f"VMs for {', '.join(nd.vm for nd in nodes)} (a warm spare, "
                                               "else terraform)"):
            hosts, replaced, spares_used, keep = _provision(home, store, console, failure, opts)
        fresh = replaced or [h.name for h in hosts]
        # A spare was converged and verified while idle, and nothing of its configuration names it.
        todo = [h for h in hosts if h.name in fresh and h.name not in spares_used]
        with timed.phase(console, "configure", f"the playbook on {', '.join(h.name for h in todo) or 'no VM'} where "
                                               "its configuration is not current (bucket mount, trainer runtime)"):
            done = phases.configure(home, console, todo) if todo else None
        # How each VM the run continues on came to be configured: the recovery record says which path it took.
        how = {name: "spare" for name in spares_used}
        how.update({h.name: "unchanged" for h in todo})
        if done is not None:
            how.update({**dict.fromkeys(done.seeded, "seed"), **dict.fromkeys(done.names, "playbook")})
    # The code and environment come from the bucket while the VMs are checked (neither needs the other): the
    # prepare phase is what it adds after verify, so the phases still add up to the wall time.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpukit-prepare") as pool:
        preparing = pool.submit(phases.prepare, home, store, lost, failure, hosts) if lost.ws.needs_prepare else None
        with timed.phase(console, "verify", f"mount live and checkpoint {lost.ckpt} reads back on {', '.join(fresh)}"):
            argvs = phases.verify(home, store, lost, hosts, fresh)
        ready = None
        if preparing is not None:
            with timed.phase(console, "prepare", f"code and requirements from the bucket on "
                                                 f"{', '.join(h.name for h in hosts)} (begun with verify)"):
                ready = preparing.result()
    started = phases.start(home, store, lost, failure, hosts, argvs, ready, group)
    warm_spares.say_start(console, [h.name for h in hosts], started.nodes, set(spares_used))
    return Moved(hosts, replaced, keep, group, started, how, spares_used, provisioned=bool(replaced))


def _provision(home: Path, store: RunStore, console: Console, failure: phases.Failure,
               opts: RecoverOptions) -> tuple[list[Any], list[str], spares.SparesUsed, list[Any]]:
    """The VMs of the next attempt, the names provisioned anew, the spares taken and the VMs kept: a free VM
    of the cluster when the run's live VM also runs another live run (never replaced under it), else a warm
    spare or terraform (a lost VM re-created, a live one of a single-node run replaced unless --same-vm)."""
    nodes = records.nodes_of(failure.attempt)
    free = neighbours.elsewhere(home, store, console, nodes, opts.same_vm, opts.keep_failed)  # refuses first
    if free is not None:
        phases.kill_attempt(home, store, failure.attempt)  # this run's processes only: the neighbour runs on
        return [free], [], {}, []
    keep = phases.keepable(home, failure, opts.keep_failed and not opts.same_vm)
    phases.kill_attempt(home, store, failure.attempt, freeze=keep)
    took = spares.for_recovery(home, console, nodes, opts.same_vm, keep, store.run)
    hosts, replaced, spares_used = took or (*phases.provision(home, console, nodes, opts.same_vm, keep), {})
    return hosts, replaced, spares_used, keep


def plan(failure: phases.Failure, lost: phases.Lost, started: AttemptRecord, upto: int, tolerance: float,
         timed: dict[str, float], check: dict[str, Any]) -> ResumePlan:
    """What the resume check of a started recovery needs (glue.watch keeps it in the bucket)."""
    return ResumePlan(failed_attempt=failure.number, new_attempt=failure.number + 1,
                      failure_class=str(failure.outcome), checkpoint_step=lost.ckpt, failure_step=lost.failure_step,
                      upto=upto, world_size=lost.group.world_size, finished_before=lost.finished_before,
                      tolerance=tolerance, started_at=started.started_at,
                      seconds={"detect": secs_between(failure.last_alive, failure.detected_at), **timed},
                      resume_check=check)


def print_table(console: Console, rec: RecoveryRecord) -> None:
    title = f"recovery of {rec.run} (attempt {rec.failed_attempt} -> {rec.new_attempt}, {rec.failure_class})"
    table = Table(title=title, min_width=len(title))  # the title on one line
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    total = 0.0
    for phase, secs in rec.seconds.items():
        table.add_row(phase, "—" if secs is None else f"{secs:.1f}")
        total += secs or 0.0
    table.add_row("[bold]total[/]", f"[bold]{total:.1f}[/]")
    console.print(table)
    lost = rec.work_lost
    console.print(f"checkpoint step {rec.checkpoint_step}, failed at step {rec.failure_step}: "
                  f"work lost {lost['steps']} steps ({lost['seconds'] or 0:.1f}s of training)")
    verdict = "[green]verified[/]" if rec.verified else f"[red]NOT verified[/]: {rec.problem}"
    if rec.verified and rec.first_resumed_step is None:
        console.print(f"resume {verdict}: the lost attempt had finished training (checkpoint "
                      f"{rec.checkpoint_step} is its last step, its outputs are in the bucket); "
                      "the new attempt had nothing to replay")
        return
    equal = rec.compared_steps
    check = rec.resume_check or {}
    if check.get("kind") == "resharded":
        console.print(f"resume check: resharded (world size {check['world_size_before']} -> {check['world_size']}): "
                      f"the data position exactly, losses within {check['tolerance']:g} of their size")
    agree = "within tolerance" if check.get("kind") == "resharded" else "equal"
    if rec.verified or equal:
        said = f"losses {agree} at steps {step_ranges(equal)}" + ("" if rec.verified else ", then differ")
    else:
        said = "its loss already differs"
    console.print(f"resume {verdict}: first resumed step {rec.first_resumed_step}, {said}")

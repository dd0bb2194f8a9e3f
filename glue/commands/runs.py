"""glue deploy / logs / incidents (and the run view of `glue status --run`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from glue.commands.options import POSITIVE_INT
from glue.errors import GlueError
from glue.paths import home
from glue.runs import deploy as deploy_mod
from glue.runs import memprobe_hint, monitor, serverless_state
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, all_run_ids
from glue.runs.vm_group import GroupSpec
from glue.scheduler.slurm import jobs as slurm_jobs
from glue.train.layout import INVALID_PREFIX

err = Console(stderr=True)
out = Console()
FOLLOW_CHECK_SECONDS = 15  # how often `logs -f` asks whether the attempt still runs


@click.command()
@click.option("--run", "run_id", required=True, help="Run id (new, or existing with --resume).")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The run config (YAML).")
@click.option("--vm", default=None,
              help="VM to run on, shared with any live run on it (default: the first VM no live run uses); "
                   "with --nodes N, N VMs comma-separated (A,B).")
@click.option("--resume", is_flag=True, help="Start a new attempt of an existing run from its last valid checkpoint.")
@click.option("--memory-limit-mb", type=POSITIVE_INT, default=None,
              help="Cap the trainer's host memory (cgroup, else rlimit).")
@click.option("--nodes", type=POSITIVE_INT, default=1, show_default=True,
              help="VMs in the torchrun group (the first N VMs no live run uses; node 0 hosts the rendezvous).")
@click.option("--procs-per-node", type=POSITIVE_INT, default=1, show_default=True,
              help="Worker processes per VM (one per GPU).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Times torchrun restarts the whole group after a worker fails (each restart resumes).")
@click.option("--require-validated", is_flag=True,
              help="With --nodes N > 1: refuse unless a smaller run of the same code met its acceptance "
                   "criteria and a drill of it passed (without it: a warning).")
@click.option("--workdir", type=click.Path(path_type=Path), default=None,
              help="Your code's folder (overrides run.yaml's `workdir:`): packed, pinned in the bucket, "
                   "unpacked on every VM as the command's working directory.")
@click.option("--dry-run", is_flag=True,
              help="Show what would ship (files, size, hash, ignored and refused files, requirements); "
                   "upload and start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print it as JSON.")
def deploy(run_id: str, config_path: Path, vm: str | None, resume: bool, memory_limit_mb: int | None, nodes: int,
           procs_per_node: int, max_restarts: int, require_validated: bool, workdir: Path | None, dry_run: bool,
           as_json: bool) -> None:
    """Preflight (boundary guard, command, bucket, evaluation set), record the manifest, start the trainer.

    With --nodes N and/or --procs-per-node G the command runs under torchrun (c10d rendezvous on
    node 0, gloo on CPU, nccl on GPU) as one data-parallel group of N x G ranks. --nodes N > 1 passes
    the scale gate first (docs/report.md).
    """
    if dry_run:
        from glue.commands import dry_run as dry

        dry.show(run_id, config_path, workdir, as_json)
        return
    if as_json:
        raise GlueError("--json goes with --dry-run (a deploy prints its progress)")
    group = GroupSpec(nodes=nodes, procs_per_node=procs_per_node, max_restarts=max_restarts)
    if slurm_jobs.on_slurm(home()):  # a batch job, placed and requeued by Slurm (docs/slurm.md)
        from glue.scheduler.slurm import submit

        submit.deploy(home(), run_id, config_path, err, resume=resume, vm=vm, group=group,
                      memory_limit_mb=memory_limit_mb, workdir=workdir)
        return
    deploy_mod.deploy(home(), run_id, config_path, vm, resume, err, memory_limit_mb=memory_limit_mb, group=group,
                      require_validated=require_validated, workdir=workdir)
    from glue.operations import warm_spares

    warm_spares.after_deploy(home(), err, run_id)  # the idle spares hold the run's own environment too


def run_summary(report: monitor.Report) -> dict[str, Any]:
    beat = report.heartbeat or {}
    return {
        "attempt": report.attempt.attempt, "vm": report.attempt.vm,
        "state": str(report.diagnosis.outcome), "reason": report.diagnosis.reason, "policy": report.diagnosis.policy,
        "step": beat.get("step"), "loss": beat.get("loss"), "step_at": beat.get("step_at"),
        "heartbeat_age_s": report.evidence.heartbeat_age_s, "incident": report.incident_key,
        "memory": beat.get("memory"),
        "nodes": [n.vm for n in report.attempt.nodes] or None,
        "rendezvous": report.attempt.rendezvous,
        "execution": report.attempt.execution_id,  # runtime lyceum-run: the Lyceum execution
    }


def show_run(run_id: str, as_json: bool) -> None:
    from glue.operations.recovery.resume_check import resume_check_text
    from glue.runs.acceptance import run_acceptance

    store = RunStore.open(home(), run_id)
    sched = slurm_jobs.job_of(store.read_manifest())
    if sched is not None and not store.attempts():  # a queued job: no attempt for the monitor to judge yet
        show_queued(store, sched, as_json)
        return
    if sched is not None:
        from glue.scheduler.slurm import requeue

        requeue.settle(home(), store)  # a Slurm restart's resume, checked like a recovery's
    summary = run_summary(monitor.check(home(), store))
    if sched is not None:
        summary["slurm"] = {k: v for k, v in slurm_jobs.run_row(store, sched, _queued()).items() if k != "run"}
    verdict = run_acceptance(store, summary["state"])
    summary["verdict"] = verdict.as_dict()
    recoveries = store.read_recoveries()
    summary["last_recovery"] = resume_check_text(recoveries[-1]) if recoveries else None
    if summary["state"] in memprobe_hint.OOM_CLASSES:  # the memprobe command that works for this run
        summary["policy"] = memprobe_hint.next_step(run_id, store.read_manifest().config)
    if as_json:
        click.echo(json.dumps({"run": run_id, **summary}, indent=2))
        return
    table = Table(title=f"run {run_id}", box=None, show_header=False)
    for key in ("attempt", "vm", "execution", "state", "reason", "step", "loss", "step_at", "incident"):
        if summary.get(key) is not None:
            table.add_row(key, str(summary[key]))
    if summary["rendezvous"]:
        table.add_row("group", f"{', '.join(summary['nodes'])} (rendezvous {summary['rendezvous']})")
    if summary.get("slurm"):
        job = summary["slurm"]
        table.add_row("slurm job", escape(f"{job['job_id']} {job['state']} {job['reason']}".strip()
                                          + f" (CUDA_VISIBLE_DEVICES={job['cuda_visible_devices']})"))
    if summary["policy"]:
        table.add_row("next", summary["policy"])
    if summary["last_recovery"]:
        table.add_row("last recovery", escape(summary["last_recovery"]))
    for m in verdict.metrics:
        shown = "—" if m.value is None else f"{m.value:.6g}"
        table.add_row(f"eval {m.name}", f"{shown} (needs {m.bounds()}) {'[green]ok[/]' if m.passed else '[red]no[/]'}")
    table.add_row("verdict", "[green]accepted[/]" if verdict.accepted else "[red]not accepted[/]: "
                  + "; ".join(verdict.reasons))
    out.print(table)


def _queued() -> dict[str, Any]:
    from glue.scheduler.slurm import queue

    return {j.job_id: j for j in queue.jobs(home())}


def show_queued(store: RunStore, sched: dict[str, Any], as_json: bool) -> None:
    """A Slurm run whose job has not started: its job id, state and why it waits."""
    row = slurm_jobs.run_row(store, sched, _queued())
    if as_json:
        click.echo(json.dumps({"run": store.run, "state": "queued", "slurm": row}, indent=2))
        return
    out.print(f"run {store.run}: Slurm job {row['job_id']} {row['state']}"
              + (f" ({row['reason']})" if row["reason"] else "") + "; no attempt started yet", highlight=False)


def slurm_status() -> dict[str, Any] | None:
    """`glue status`'s Slurm part (runs, job ids, states, pending reasons, GPUs); None without Slurm."""
    return slurm_jobs.queue_view(home()) if slurm_jobs.on_slurm(home()) else None


def print_slurm(view: dict[str, Any]) -> None:
    if "error" in view:
        err.print(f"[red]Slurm: {escape(view['error'])}[/]")
        return
    gpus = view["gpus"]
    table = Table(title=f"Slurm: GPUs {gpus['used']} in use, {gpus['free']} free of {gpus['total']}", box=None)
    for col in ("run", "job", "state", "reason", "nodes", "attempt", "ended"):
        table.add_column(col)
    for r in view["runs"]:
        table.add_row(r["run"], r["job_id"], r["state"], r["reason"], r["nodes"], str(r["attempt"] or ""),
                      str(r["ended"] or ""))
    out.print(table)


@click.command()
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new log output until the attempt ends.")
@click.option("--attempt", type=POSITIVE_INT, default=None, help="Attempt number (default: all).")
@click.option("--platform", is_flag=True, help="runtime lyceum-run: the execution's own log from Lyceum's logs API "
                                               "(the latest attempt, or --attempt).")
@click.option("--job-output", is_flag=True, help="A Slurm run: the batch job's own output on its node (every "
                                                 "(re)start of the job), not the trainer's log.")
def logs(run_id: str, follow: bool, attempt: int | None, platform: bool, job_output: bool) -> None:
    """The trainer's log, from the bucket (shipped every few seconds)."""
    h = home()
    if job_output:
        click.echo(slurm_jobs.job_output(h, run_id), nl=False)
        return
    store = RunStore.open(h, run_id)
    store.read_manifest()
    known = store.attempts()
    if attempt is not None and attempt not in known:
        raise GlueError(f"run {run_id} has no attempt {attempt}; its attempts: {', '.join(map(str, known)) or 'none'}")
    if platform:
        n = attempt or max(known or [0])
        rec = store.read_attempt(n)
        if rec is None or not serverless_state.is_serverless(rec):
            raise GlueError(f"--platform reads a Lyceum execution's log; attempt {n} of run {run_id} "
                            "ran on a VM (drop --platform)")
        click.echo("".join(line + "\n" for line in serverless_state.logs(rec)), nl=False)
        return
    shown = 0
    checked = time.monotonic()
    while True:
        text = store.log_text(attempt)
        click.echo(text[shown:], nl=False)
        shown = len(text)
        if not follow:
            return
        last = attempt or max(store.attempts() or [0])
        if store.exit_record(last) is not None:
            click.echo(store.log_text(attempt)[shown:], nl=False)
            return
        why = _ended(store, last)
        if why is None and time.monotonic() - checked > FOLLOW_CHECK_SECONDS:
            # A lost or stalled attempt never writes its exit record: ask the monitor instead.
            checked = time.monotonic()
            report = monitor.check(h, store)
            now = report.attempt.attempt
            if now != last:
                why = f"attempt {now} replaced it"
            elif report.diagnosis.outcome is not AttemptClass.RUNNING:
                why = f"{report.diagnosis.outcome}: {report.diagnosis.reason}"
        if why is not None:
            click.echo(store.log_text(attempt)[shown:], nl=False)
            err.print(f"attempt {last} of run {run_id} is no longer running ({why}); "
                      f"see `glue incidents --run {run_id}`")
            return
        time.sleep(2)


@click.command()
@click.option("--run", "run_id", required=True, help="Run id.")
def stop(run_id: str) -> None:
    """Stop a run's latest attempt on request: its trainer killed (or its Lyceum execution aborted); `glue watch`
    leaves it stopped until a new attempt (deploy --resume, recover)."""
    from glue.watch.stop_run import stop_run

    if slurm_jobs.on_slurm(home()) and slurm_jobs.job_of(RunStore.open(home(), run_id).read_manifest()) is not None:
        err.print(slurm_jobs.stop(home(), run_id))  # scancel: Slurm must not requeue it
        return
    err.print(stop_run(home(), run_id))


def _ended(store: RunStore, n: int) -> str | None:
    """Why attempt n has ended, as its record says (its class, or a later attempt), else None."""
    rec = store.read_attempt(n)
    ended = rec and (rec.failure_class or rec.outcome)
    if rec and ended:
        return f"{ended}: {rec.reason}" if rec.reason else str(ended)
    later = [a for a in store.attempts() if a > n]
    return f"attempt {later[0]} replaced it" if later else None


@click.command()
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def incidents(run_id: str, as_json: bool) -> None:
    """Failures recorded for a run: class, reason, evidence and what to do next."""
    h = home()
    store = RunStore.open(h, run_id)
    monitor.check(h, store)  # records an incident for a failure not yet seen
    items = monitor.incidents(store)
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return
    if not items:
        out.print(f"run {run_id}: no incidents")
        return
    for inc in items:
        head, *rest = incident_lines(inc)
        out.print(head, highlight=False)
        for line in rest:
            out.print(f"  {line}", markup=False, highlight=False)


def incident_lines(inc: dict[str, Any]) -> list[str]:
    """One incident as lines (the first with markup, values escaped). Three kinds share incidents/: an
    attempt's failure (monitor), the watcher's budget_exhausted, and the trainer's checkpoint incidents
    (ckpt_interrupted / ckpt_corrupt, written by glue.train where the checkpoint target is the run's prefix)."""
    cls = str(inc.get("class", "?"))
    when = escape(str(inc.get("detected_at") or inc.get("at") or "?"))
    if cls.startswith("ckpt_"):
        where = f" (rank {inc['rank']} on {inc['host']})" if inc.get("host") else ""
        fell = inc.get("fell_back_to")
        return [f"[bold]{when}[/] checkpoint step {inc.get('step')}{escape(where)}: [red]{escape(cls)}[/] — "
                f"{escape(str(inc.get('what', '')))}",
                f"object {inc.get('object')}; "
                + (f"the restore fell back to step {fell}" if fell is not None
                   else "no valid checkpoint was left to restore from"),
                "next: nothing to do if the restore's step is the one you expect; the skipped step's objects "
                "are kept" + (f" under {INVALID_PREFIX}" if cls == "ckpt_corrupt" else "")]
    vm = f" on {inc['vm']}" if inc.get("vm") else ""
    lines = [f"[bold]{when}[/] attempt {escape(str(inc.get('attempt', '?')))}{escape(vm)}: [red]{escape(cls)}[/] — "
             f"{escape(str(inc.get('reason', '')))}"]
    if "last_completed_step" in inc:
        lines.append(f"last completed step {inc['last_completed_step']}, "
                     f"last valid checkpoint {inc.get('last_valid_checkpoint')}")
    if inc.get("failure_class"):
        lines.append(f"after {inc['failure_class']}: {inc.get('failure_reason', '')}")
    cause = inc.get("cause")
    if cause and (len(inc.get("nodes") or []) > 1 or inc.get("consequences")):
        lines.append(f"cause: {_event(cause)}")
        lines.extend(f"then:  {_event(later)}" for later in inc.get("consequences") or [])
    if inc.get("error_excerpt"):
        lines.extend(str(inc["error_excerpt"]).splitlines())
    lines.append(f"next: {inc.get('next_step') or inc.get('policy') or 'glue status --run ' + str(inc.get('run'))}")
    return lines


def _event(e: dict[str, Any]) -> str:
    from glue.runs.timeline import Event

    return Event.from_dict(e).describe()


def list_runs() -> list[str]:
    try:
        return all_run_ids(home())
    except GlueError:
        return []


__all__ = ["RunStore", "deploy", "incidents", "list_runs", "logs", "show_run"]
COMMANDS = [deploy, logs, incidents, stop]

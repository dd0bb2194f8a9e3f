"""`glue drill`: the recovery test as part of the workload.

A reference run of N steps and an identical run that loses its VM (destroyed, not just the
process) at step k and is recovered onto a new VM from the bucket. Pass only when per-step losses,
final parameters and optimizer state are identical; otherwise name the first differing step and
tensor, and (from the trainer's per-step input fingerprints) whether data position or RNG was lost.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from glue.cluster import current
from glue.errors import GlueError
from glue.operations import lifecycle
from glue.operations.recovery import checkpoint_diff, drill_verdict
from glue.operations.recovery import recover as recover_mod
from glue.operations.recovery.resume_check import STEP_INPUTS, losses_agree, step_ranges
from glue.paths import glue_command
from glue.runs import config as runconfig
from glue.runs import deploy as deploy_mod
from glue.runs import lease, monitor
from glue.runs.classify import AttemptClass
from glue.runs.records import RecoveryRecord
from glue.runs.store import RunStore
from glue.train import trainer_vars
from glue.train.layout import COMMIT, run_prefix
from glue.workdir.pin import Workspace


@dataclass
class DrillResult:
    passed: bool
    ref_run: str
    drill_run: str
    steps: int
    kill_at: int  # the step asked for
    destroyed_at: int | None = None  # the step the VM died at (the trainer holds there: equal to kill_at)
    first_bad_step: int | None = None
    first_bad_tensor: str | None = None
    component: str | None = None
    problem: str | None = None
    recovery: dict[str, Any] = field(default_factory=dict)
    compared_steps: int = 0
    compared_tensors: int = 0
    verdict: str = "fail"  # pass | fail | lost | nondeterministic | uncomparable
    warnings: list[str] = field(default_factory=list)
    compared: str | None = None  # what of the final checkpoints was and was not compared, in one line
    # The drill recovers at the world size it ran at, so its check is always the exact one.
    check: str = "bitwise (same world size): every loss, the final parameters and optimizer state equal"


def _wait(home: Path, store: RunStore, pred: Callable[[monitor.Report], bool], what: str,
          timeout: float) -> monitor.Report:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rep = monitor.check(home, store)
        if pred(rep):
            return rep
        if rep.diagnosis.outcome.is_failure:
            raise GlueError(f"run {store.run} failed while waiting for {what}: {rep.diagnosis.outcome} "
                            f"({rep.diagnosis.reason})")
        time.sleep(0.5)
    raise GlueError(f"run {store.run}: timed out after {timeout:.0f}s waiting for {what}")


def _completed(rep: monitor.Report) -> bool:
    return rep.diagnosis.outcome is AttemptClass.COMPLETED


def _losses(store: RunStore) -> dict[int, dict[str, Any]]:
    merged: dict[int, dict[str, Any]] = {}
    for _, steps in sorted(store.metrics().items()):
        merged.update(steps)  # a later attempt's record of a step replaces the replayed one
    return merged


def compare_final(ref: RunStore, drill: RunStore, step: int) -> checkpoint_diff.Comparison:
    """Both runs' step-N checkpoints compared object by object, by what each holds (checkpoint_diff)."""
    from glue.train.checkpoint.format import Commit

    commits = []
    for store in (ref, drill):
        data = store.checkpoint_object(step, COMMIT)
        if data is None:
            raise GlueError(f"run {store.run} has no checkpoint at its final step {step}")
        try:
            commits.append(Commit.parse(data, step))
        except ValueError as exc:
            raise GlueError(f"run {store.run}'s checkpoint at its final step {step} cannot be read: {exc}") from exc
    return checkpoint_diff.compare((commits[0], commits[1]), (lambda key: ref.checkpoint_object(step, key),
                                                              lambda key: drill.checkpoint_object(step, key)))


def run_neutral(config: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A deployed run's config with its run id put back as `{run}` in the locations, so the drill and its
    reference write under their own prefixes. A location that does not name the run would be shared
    with it (the drill's checkpoints pruning the run's own): refused."""
    out = {**config}
    for section, key in (("checkpoint", "target"), ("outputs", "destination")):
        where = str(config[section][key])
        mine, neutral = "/" + run_prefix(run_id), "/" + run_prefix("{run}")  # /runs/<run>/, /runs/{run}/
        named = where.replace(mine, neutral)
        named = named[: -len(mine) + 1] + neutral[:-1] if named.endswith(mine[:-1]) else named
        if "{run}" not in named:
            raise GlueError(f"run {run_id}'s {section}.{key} {where} does not name the run: a drill of it would "
                            "write there too; pass --config with {run} in its locations")
        out[section] = {**config[section], key: named}
    return out


def _config_of(home: Path, base: RunStore, run_id: str, config_path: Path | None) -> tuple[Path, Workspace | None]:
    """The run.yaml to drill, and the code it runs: the given config (the workdir as it is now), or an
    existing run's own config with its code and requirements as its manifest pins them."""
    if config_path is not None:
        return config_path, None
    if not base.exists():
        raise GlueError(f"run {run_id!r} does not exist; pass --config run.yaml to drill a new workload")
    config_path = Path(home) / "drill" / f"{run_id}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    manifest = base.read_manifest()
    config_path.write_text(yaml.safe_dump(run_neutral(manifest.config, run_id)))
    return config_path, Workspace.from_manifest(manifest)


def _new_ids(home: Path, run_id: str) -> tuple[str, str]:
    """The next unused drill of run_id, and its reference: (<run>-drill<k>, <run>-drill<k>-ref)."""
    k = 1
    while RunStore.open(home, f"{run_id}-drill{k}").exists():
        k += 1
    return f"{run_id}-drill{k}", f"{run_id}-drill{k}-ref"


def _destroy_and_recover(home: Path, dr: RunStore, victim_name: str, result: DrillResult, console: Console,
                         tolerance: float, timeout: float) -> None:
    """Wait for the drill run's hold, destroy its VM there, and recover it as `glue recover` would."""
    with console.status(f"training {dr.run} to step {result.kill_at}"):
        held = _wait(home, dr, lambda r: bool((r.heartbeat or {}).get("held")), f"the hold at step {result.kill_at}",
                     timeout)
    with lease.held(dr, "drill"):  # nobody else recovers the drill run while it loses its VM
        first = dr.read_attempt(1)
        if first is None or not first.vm_id:
            raise GlueError(f"drill run {dr.run} recorded no VM for attempt 1; nothing to destroy")
        victim_id = first.vm_id
        lifecycle.destroy_vm(home, console, victim_name, victim_id)
        result.destroyed_at = (held.heartbeat or {}).get("step")
        console.print(f"[red]destroyed VM {victim_name}[/] ({victim_id}) under {dr.run} at step {result.destroyed_at}")
        try:
            result.recovery = recover_mod.recover(home, dr.run, console, tolerance=tolerance,
                                                  wait_timeout=timeout).to_dict()
        except GlueError as exc:
            result.problem = str(exc)
            made = dr.read_recoveries()
            result.recovery = made[-1].to_dict() if made else {}


def compare_losses(result: DrillResult, ref_l: dict[int, dict[str, Any]], dr_l: dict[int, dict[str, Any]],
                   tolerance: float) -> None:
    """Every step of both runs, in order: the first whose losses disagree, and the step input that differs
    (the component that was not restored); a step missing from either run is a problem, not a pass."""
    total = result.steps
    for label, losses in (("the reference", ref_l), ("the drill run", dr_l)):
        gone = [s_ for s_ in range(1, total + 1) if s_ not in losses]
        if gone and result.problem is None:
            result.problem = f"step(s) {step_ranges(gone)} missing from {label}: those steps cannot be compared"
    for step in range(1, total + 1):
        a, b = ref_l.get(step), dr_l.get(step)
        if a is None or b is None:
            continue
        result.compared_steps += 1
        if not losses_agree(float(a["loss"]), float(b["loss"]), tolerance):
            result.first_bad_step = step
            lost = [n for k_, n in STEP_INPUTS.items() if k_ in a and a[k_] != b.get(k_)]
            if "data position" in lost and "worker RNG" in lost:
                lost.remove("worker RNG")  # other samples have other contents: the position is the cause
            result.component = ", ".join(lost) or "model/optimizer state"
            break


def _judge(result: DrillResult, ref: RunStore, dr: RunStore, tolerance: float) -> None:
    """Losses step by step, then the final checkpoints; a difference before the VM was lost is the job's."""
    ref_l = _losses(ref)
    compare_losses(result, ref_l, _losses(dr), tolerance)
    early = drill_verdict.before_loss(ref_l, dr.metrics().get(1, {}), tolerance)
    final = None
    if result.problem is None and early is not None:
        try:  # only to name the streams that differ: without final checkpoints the verdict stands
            final = compare_final(ref, dr, result.steps)
        except GlueError:
            final = None
    elif result.problem is None and result.first_bad_step is None:
        final = compare_final(ref, dr, result.steps)
    judge(result, early, final)


def judge(result: DrillResult, early: drill_verdict.Early | None, final: checkpoint_diff.Comparison | None) -> None:
    """The verdict from the losses' comparison (in result), the first attempt's first difference from the
    reference (early) and the final checkpoints' comparison."""
    if final is not None:
        result.compared_tensors, result.compared = final.tensors, final.summary()
    if early is not None:  # before the VM was lost: whatever else went wrong, the job does not repeat itself
        after = f" (and then: {result.problem})" if result.problem else ""
        result.first_bad_step, result.component = early.step, None
        result.verdict, result.problem = "nondeterministic", drill_verdict.nondeterminism(early, final) + after
    elif result.problem is None and result.first_bad_step is not None:
        result.verdict, result.problem = "lost", "the recovered run diverged from the reference"
    elif result.problem is None and result.compared_steps == 0:
        result.problem = "no step was compared"
    elif result.problem is None and final is not None:
        _judge_final(result, final)
    result.passed = result.problem is None
    result.verdict = "pass" if result.passed else result.verdict


def _judge_final(result: DrillResult, final: checkpoint_diff.Comparison) -> None:
    """Every loss agreed: the final checkpoints decide. A random stream alone differing is a warning."""
    state = [d for d in final.differences if not d.rng]
    result.warnings = drill_verdict.rng_warnings(final)
    if state:
        result.first_bad_tensor = state[0].where
        result.verdict, result.problem = "lost", "the recovered run diverged from the reference"
    elif final.uncomparable:
        result.verdict = "uncomparable"
        result.problem = f"could not compare {final.uncomparable[0]}"


def drill(home: Path, run_id: str, config_path: Path | None, console: Console, *, steps: int | None = None,
          kill_at: int | None = None, tolerance: float = 0.0, timeout: float = 600,
          overrides: dict[str, Any] | None = None) -> DrillResult:
    """A reference run and a drill run of the same workload on two VMs; the drill run's VM destroyed at
    step kill_at and recovered; both runs compared step by step and at the end."""
    runconfig.check_run_id(run_id)
    base = RunStore.open(home, run_id)
    config_path, pinned = _config_of(home, base, run_id, config_path)
    drill_id, ref_id = _new_ids(home, run_id)
    rc = runconfig.load(config_path, drill_id, base.info.name)
    total = int(steps or rc.config.get("steps", 100))
    interval = rc.checkpoint.interval_steps
    at = int(kill_at or max(interval + 1, total // 2))
    if not interval < at < total:
        raise GlueError(f"--kill-at {at} must be after the first checkpoint (step {interval}) and before the last "
                        f"step ({total})")
    cfg = {**(overrides or {}), "steps": total, "checkpoint_interval": interval}
    hosts = current.hosts(home)  # after the config: a bad one is said first, with or without a cluster
    if len(hosts) < 2:
        raise GlueError("the drill needs 2 VMs (one runs the reference, the other is destroyed); "
                        "run `glue up --vms 2`")
    victim, ref_host = hosts[0], hosts[-1]
    console.print(f"drill: reference [bold]{ref_id}[/] on {ref_host.name}, drill [bold]{drill_id}[/] on "
                  f"{victim.name}; {total} steps, its VM destroyed at step {at}")
    deploy_mod.deploy(home, ref_id, config_path, ref_host.name, False, console, config_overrides=cfg, pinned=pinned)
    # The drill run's first attempt holds right after step `at` (glue.train.run.context: GPUKIT_HOLD_AT), so the
    # VM is destroyed at exactly that step; the recovered attempt (2) does not hold.
    deploy_mod.deploy(home, drill_id, config_path, victim.name, False, console, config_overrides=cfg,
                      env_overrides={trainer_vars.HOLD_AT: f"1:{at}"}, pinned=pinned)
    ref, dr = RunStore.open(home, ref_id), RunStore.open(home, drill_id)
    result = DrillResult(passed=False, ref_run=ref_id, drill_run=drill_id, steps=total, kill_at=at)
    _destroy_and_recover(home, dr, victim.name, result, console, tolerance, timeout)
    with console.status("waiting for both runs to finish"):
        _wait(home, ref, _completed, "the reference to complete", timeout)
        if result.problem is None:
            _wait(home, dr, _completed, "the drill run to complete", timeout)
    _judge(result, ref, dr, tolerance)
    print_result(console, result)
    dr.put_drill(result.__dict__)
    # As typed in another shell: a kit home other than the default has to be named (make demo's is).
    where = f"GPUKIT_HOME={home} " if os.environ.get("GPUKIT_HOME") else ""
    console.print(f"see it: {where}{glue_command()} report --run {drill_id}  (losses over the reference, recovery "
                  "phases, cost)", soft_wrap=True)  # one line even at 80 columns: it is pasted as it stands
    return result


def print_result(console: Console, r: DrillResult) -> None:
    table = Table(title=f"drill {r.drill_run} vs {r.ref_run}", show_header=False, box=None)
    table.add_row("asked to destroy the VM at step", str(r.kill_at))
    table.add_row("VM destroyed at step", str(r.destroyed_at))
    ckpt = RecoveryRecord.from_dict(r.recovery).checkpoint_step if r.recovery else None
    table.add_row("resumed from checkpoint", str(ckpt))
    if r.destroyed_at is not None and ckpt is not None:
        table.add_row("steps replayed", f"{r.destroyed_at - ckpt} ({ckpt + 1}..{r.destroyed_at})")
    table.add_row("per-step losses compared", str(r.compared_steps))
    table.add_row("final tensors compared", str(r.compared_tensors))
    if r.compared:
        table.add_row("final checkpoints", r.compared)
    table.add_row("check applied", r.check)
    if r.first_bad_step is not None and r.verdict == "nondeterministic":
        table.add_row("first differing step", f"{r.first_bad_step} (before the VM was lost: the job's own)")
    elif r.first_bad_step is not None:
        table.add_row("first differing step", f"{r.first_bad_step} (lost: {r.component})")
    if r.first_bad_tensor:
        table.add_row("first differing tensor", r.first_bad_tensor)
    for w in r.warnings:
        table.add_row("[yellow]warning[/]", w)
    verdict = "[green]PASS[/]: identical losses, parameters and optimizer state" if r.passed \
        else f"[red]FAIL[/]: {r.problem}"
    table.add_row("verdict", verdict)
    console.print(table)

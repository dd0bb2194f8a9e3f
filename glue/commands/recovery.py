"""glue recover / drill / advise."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from glue.commands.options import HOURS, NON_NEGATIVE, POSITIVE_FLOAT, POSITIVE_INT, SECONDS
from glue.errors import GlueError
from glue.paths import home
from glue.runs.store import RunStore

err = Console(stderr=True)


@click.command()
@click.option("--run", "run_id", required=True, help="The failed run.")
@click.option("--force", is_flag=True, help="Recover even an oom_*, bad_restart or user_error failure.")
@click.option("--from-scratch", is_flag=True, help="With no valid checkpoint, restart from step 0.")
@click.option("--same-vm", is_flag=True, help="Reuse the VM when it is still alive (default: a new VM).")
@click.option("--verify-steps", type=POSITIVE_INT, default=5, show_default=True,
              help="Steps the resumed run must take past the checkpoint; each one the failed attempt "
                   "also logged must match its loss (all of the lost steps, so fewer than K when it failed "
                   "sooner).")
@click.option("--tolerance", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Allowed loss difference (0 = exact, right for CPU; use e.g. 1e-3 on GPU).")
@click.option("--timeout", "wait_timeout", type=POSITIVE_FLOAT, default=600, show_default=True,
              help="Seconds to wait for the resumed run to reach the verification steps.")
@click.option("--nodes", type=POSITIVE_INT, default=None,
              help="Continue a multi-VM run on this many of its surviving VMs (fewer than it had) when the lost "
                   "ones cannot be replaced: nothing is provisioned, the checkpoint restores at the smaller world "
                   "size (sharded state and data position resharded).")
@click.option("--reshard-tolerance", type=NON_NEGATIVE, default=0.1, show_default=True,
              help="With --nodes: allowed relative loss difference (each rank sees other samples per step).")
def recover(run_id: str, force: bool, from_scratch: bool, same_vm: bool, verify_steps: int, tolerance: float,
            wait_timeout: float, nodes: int | None, reshard_tolerance: float) -> None:
    """Recover a failed run onto a new VM from its last valid checkpoint, and verify the resume."""
    from glue.operations.recovery import recover as recover_mod
    from glue.scheduler.slurm import takeover

    if takeover.is_slurm_run(RunStore.open(home(), run_id)):  # Slurm restarts it: glue never starts one beside it
        if force or from_scratch or same_vm or nodes is not None:
            raise GlueError(f"run {run_id} runs under Slurm, which places and restarts its job: leave out "
                            "--force, --from-scratch, --same-vm and --nodes (docs/slurm.md)")
        err.print(f"[green]{run_id}[/]: {takeover.recover(home(), run_id, err).note}")
        return
    if nodes is not None and same_vm:
        raise GlueError("--nodes continues on the surviving VMs as they are; leave out --same-vm")
    recover_mod.recover(home(), run_id, err, force=force, from_scratch=from_scratch, same_vm=same_vm,
                        verify_steps=verify_steps, tolerance=tolerance, wait_timeout=wait_timeout, nodes=nodes,
                        reshard_tolerance=reshard_tolerance)


COMMANDS = [recover]



@click.command()
@click.option("--run", "run_id", required=True, help="Drill name (or an existing run whose config to drill).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Run config (default: the existing run's).")
@click.option("--steps", type=POSITIVE_INT, default=None, help="Steps of both runs (default: the config's).")
@click.option("--kill-at", type=POSITIVE_INT, default=None,
              help="Destroy the drill run's VM at this step (default: half).")
@click.option("--tolerance", type=NON_NEGATIVE, default=0.0, show_default=True, help="Allowed loss difference.")
@click.option("--timeout", type=POSITIVE_FLOAT, default=600, show_default=True, help="Seconds to wait for each phase.")
def drill(run_id: str, config_path: Path | None, steps: int | None, kill_at: int | None, tolerance: float,
          timeout: float) -> None:
    """Reference run vs. a run whose VM is destroyed mid-run and recovered; pass/fail."""
    from glue.operations.recovery import drill as drill_mod

    result = drill_mod.drill(home(), run_id, config_path, err, steps=steps, kill_at=kill_at, tolerance=tolerance,
                             timeout=timeout)
    sys.exit(0 if result.passed else 1)


COMMANDS.append(drill)


@click.command()
@click.option("--run", "run_id", default=None, help="The run whose measured costs to use.")
@click.option("--mtbf", type=HOURS, default=None,
              help="Mean time between failures in hours (default: measured).")
@click.option("--restore-seconds", type=SECONDS, default=None, help="Override the measured restore cost.")
@click.option("--example", is_flag=True, help="Print the worked example (failure at minute 95) and exit.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def advise(run_id: str | None, mtbf: float | None, restore_seconds: float | None, example: bool,
           as_json: bool) -> None:
    """Checkpoint interval (Young, Daly) from the run's measured save/restore cost and failure rate."""
    import json

    from rich.table import Table

    from glue.errors import GlueError
    from glue.operations.recovery import advise as advise_mod

    if example:
        if as_json:
            click.echo(json.dumps(advise_mod.worked_example_numbers(), indent=2))
            return
        for line in advise_mod.worked_example():
            click.echo(line)
        return
    if run_id is None:
        raise GlueError("pass --run RUN (or --example for the worked case)")
    res = advise_mod.advise(RunStore.open(home(), run_id), mtbf, restore_seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    out = Console()
    out.print(f"run {run_id}: save stall C = {res['save_stall_s']:.3f}s (full save {res['save_full_s']:.2f}s, "
              f"{res['saves_measured']} saves), restore R = {res['restore_s']:.1f}s ({res['restore_source']}), "
              f"MTBF = {res['mtbf_s'] / 3600:.2f} h ({res['mtbf_source']})")
    table = Table(box=None)
    for col in ("interval", "seconds", "steps", "lost per failure (s)", "ckpt overhead", "total overhead"):
        table.add_column(col, justify="right")
    for name, row in res["options"].items():
        table.add_row(name, f"{row['interval_s']:.1f}", str(row["interval_steps"] or "—"),
                      f"{row['expected_loss_per_failure_s']:.1f}", f"{row['checkpoint_overhead_pct']:.3f}%",
                      f"{row['overhead_pct']:.3f}%")
    out.print(table)


COMMANDS.append(advise)

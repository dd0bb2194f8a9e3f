"""glue recover / drill / advise."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from glue.paths import home

err = Console(stderr=True)


@click.command()
@click.option("--run", "run_id", required=True, help="The failed run.")
@click.option("--force", is_flag=True, help="Recover even an oom_*, bad_restart or user_error failure.")
@click.option("--from-scratch", is_flag=True, help="With no valid checkpoint, restart from step 0.")
@click.option("--same-vm", is_flag=True, help="Reuse the VM when it is still alive (default: a new VM).")
@click.option("--verify-steps", type=int, default=5, show_default=True,
              help="Resumed steps whose losses must match the pre-failure log.")
@click.option("--tolerance", type=float, default=0.0, show_default=True,
              help="Allowed loss difference (0 = exact, right for CPU; use e.g. 1e-3 on GPU).")
@click.option("--timeout", "wait_timeout", type=float, default=600, show_default=True,
              help="Seconds to wait for the resumed run to reach the verification steps.")
def recover(run_id: str, force: bool, from_scratch: bool, same_vm: bool, verify_steps: int, tolerance: float,
            wait_timeout: float) -> None:
    """Recover a failed run onto a new VM from its last valid checkpoint, and verify the resume."""
    from glue import recover as recover_mod

    recover_mod.recover(home(), run_id, err, force=force, from_scratch=from_scratch, same_vm=same_vm,
                        verify_steps=verify_steps, tolerance=tolerance, wait_timeout=wait_timeout)


COMMANDS = [recover]



@click.command()
@click.option("--run", "run_id", required=True, help="Drill name (or an existing run whose config to drill).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Run config (default: the existing run's).")
@click.option("--steps", type=int, default=None, help="Steps of both runs (default: the config's).")
@click.option("--kill-at", type=int, default=None, help="Destroy the drill run's VM at this step (default: half).")
@click.option("--tolerance", type=float, default=0.0, show_default=True, help="Allowed loss difference.")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds to wait for each phase.")
def drill(run_id: str, config_path: Path | None, steps: int | None, kill_at: int | None, tolerance: float,
          timeout: float) -> None:
    """Reference run vs. a run whose VM is destroyed mid-run and recovered; pass/fail."""
    from glue import drill as drill_mod

    result = drill_mod.drill(home(), run_id, config_path, err, steps=steps, kill_at=kill_at, tolerance=tolerance,
                             timeout=timeout)
    sys.exit(0 if result.passed else 1)


COMMANDS.append(drill)

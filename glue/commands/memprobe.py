"""glue memprobe: the smallest input that runs out of memory, the whole step's memory, and remedies."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click
from rich.console import Console

from glue.commands.options import POSITIVE_INT, FiniteFloatRange
from glue.errors import GlueError
from glue.memprobe import investigate as probe_mod
from glue.memprobe import output as report_mod
from glue.memprobe import remedies as rem
from glue.memprobe.limits import MECHANISMS
from glue.memprobe.runner import TrialOutcome
from glue.memprobe.session import MIN_TRIAL_TIMEOUT_S, Request, prepare
from glue.paths import home

err = Console(stderr=True)


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A run config (run.yaml) whose `config:` is probed.")
@click.option("--run", "run_id", default=None, help="A run in the bucket: probe its own command as deployed (on a VM, "
              "under the memory limit its failed attempt had); the report is saved with the run.")
@click.option("--vm", default=None, help="A run's own job: the VM its trials run on (default: the VM the failed "
              "attempt ran on, else the first).")
@click.option("--vary", multiple=True, metavar="KEY", help="The config value to change, one at a time (repeatable; "
              f"any whole-number key of a run's `config:`; tiny_gpt: {', '.join(probe_mod.VARIABLES)}; "
              "default batch_size).")
@click.option("--range", "ranges", multiple=True, metavar="[NAME=]LO:HI",
              help=f"Values to search (default 1 to {probe_mod.DEFAULT_REACH}x the config's).")
@click.option("--grid", type=click.Choice(["int", "pow2"]), default="int", show_default=True,
              help="Search every integer of the range, or only LO·2^k.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Where trials run (default: the config's device).")
@click.option("--memory-limit-mb", type=POSITIVE_INT, default=None,
              help="Limit per trial: host memory on cpu (cgroup, else RLIMIT_AS), the CUDA allocator on cuda. "
                   "Default: the failed attempt's limit (--run), else 90% of available memory (cpu) / the GPU.")
@click.option("--limit-mechanism", type=click.Choice(MECHANISMS), default="auto", show_default=True,
              help="How a cpu trial's limit is applied.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a trainer setting (repeatable).")
@click.option("--trial-steps", type=click.IntRange(min=1), default=2, show_default=True, metavar="N",
              help="Whole steps per search trial (2: the second one holds the optimizer state).")
@click.option("--accept-steps", type=click.IntRange(min=2), default=20, show_default=True, metavar="K",
              help="K: steps per remedy trial; judged by the run's acceptance criteria (run.yaml evaluation.metrics) "
                   "on the last evaluation it recorded, else by the loss after K steps.")
@click.option("--tolerance", type=FiniteFloatRange(min=0, min_open=True), default=0.05, show_default=True,
              metavar="FRACTION", help="Accepted relative difference of the loss after K steps from the reference.")
@click.option("--accum", type=click.IntRange(min=2), default=4, show_default=True, metavar="N",
              help="Micro-batches for the grad_accum remedy.")
@click.option("--remedy", "remedy_names", multiple=True, metavar="NAME",
              help=f"Remedies to compare (repeatable; default all): a run's declared ones (run.yaml memprobe: "
                   f"{{remedies: ...}}) and its framework's (HF Trainer: gradient_checkpointing, bf16, grad_accum; "
                   f"Lightning: grad_accum, bf16); tiny_gpt: {', '.join(rem.NAMES)}.")
@click.option("--no-remedies", is_flag=True, help="Skip the remedy comparison.")
@click.option("--no-breakdown", is_flag=True, help="Skip the profiled phase breakdown.")
@click.option("--remedies-at", type=POSITIVE_INT, default=None, metavar="V",
              help="Value of the (first) varied input to compare remedies at (default: the config's if it fails, "
                   "else the smallest that fails).")
@click.option("--trial-timeout", type=FiniteFloatRange(min=MIN_TRIAL_TIMEOUT_S), default=600, show_default=True,
              metavar="SECONDS", help="Time limit per trial (a trial over it is killed and ends the search).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the JSON report here (default with --config: ./memprobe-<UTC>.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of tables.")
def memprobe(config_path: Path | None, run_id: str | None, vm: str | None, vary: tuple[str, ...],
             ranges: tuple[str, ...], grid: str,
             device: str | None, memory_limit_mb: int | None, limit_mechanism: str, sets: tuple[str, ...],
             trial_steps: int, accept_steps: int, tolerance: float, accum: int, remedy_names: tuple[str, ...],
             no_remedies: bool, no_breakdown: bool, remedies_at: int | None, trial_timeout: float,
             out_path: Path | None, as_json: bool) -> None:
    """Out-of-memory investigation: each trial a fresh process with ONE input changed; peak memory and
    whether it fails; the boundary (largest that fits, smallest that fails); the whole step's memory
    by part (weights, gradients, optimizer state, activations); remedies against a loss check."""
    command = (" ".join(["glue", *map(shlex.quote, sys.argv[sys.argv.index("memprobe"):])])
               if "memprobe" in sys.argv else None)
    req = Request(config_path=config_path, run_id=run_id, vary=vary, ranges=ranges, grid=grid, device=device,
                  memory_limit_mb=memory_limit_mb, limit_mechanism=limit_mechanism, sets=sets,
                  trial_steps=trial_steps, accept_steps=accept_steps, tolerance=tolerance, accum=accum,
                  remedy_names=remedy_names, no_remedies=no_remedies, no_breakdown=no_breakdown,
                  remedies_at=remedies_at, trial_timeout=trial_timeout, out_path=out_path, vm=vm, command=command)

    def progress(what: str, outcome: TrialOutcome | None) -> None:
        if outcome is not None:
            err.print(report_mod.trial_line(what, outcome), highlight=False)
        else:
            err.print(f"memprobe: {what}", highlight=False)

    session = prepare(home(), req, progress)
    err.print(f"memprobe: {session.summary}")
    result = session.run()
    if as_json:
        click.echo(json.dumps(result.report, indent=2, sort_keys=True))
    else:
        # a pipe or file gets the whole table, not 80 columns of it
        report_mod.print_report(Console() if sys.stdout.isatty() else Console(width=160), result.report)
    # Paths whole on one line (copied into the next command), however narrow the terminal.
    err.print("saved: " + "; ".join(result.saved), soft_wrap=True)
    if result.unsaved is not None:
        raise GlueError(result.unsaved)

COMMANDS = [memprobe]

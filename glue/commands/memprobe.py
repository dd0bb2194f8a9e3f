"""glue memprobe: the smallest input that runs out of memory, the whole step's memory, and remedies."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from glue.commands.options import POSITIVE_INT, FiniteFloatRange
from glue.errors import GlueError
from glue.memprobe import investigate as probe_mod
from glue.memprobe import output as report_mod
from glue.memprobe import remedies as rem
from glue.memprobe import source as source_mod
from glue.memprobe.limits import MECHANISMS, safety_limit_mb, total_mb
from glue.memprobe.runner import TrialOutcome
from glue.paths import home
from glue.runs.store import utc_iso

err = Console(stderr=True)

# A trial is a fresh process that imports torch and builds the model before its first step (seconds on
# its own): a shorter limit would only time every trial out.
MIN_TRIAL_TIMEOUT_S = 10.0


def unique(items: tuple[str, ...]) -> list[str]:
    """Repeated --vary/--remedy values once each, in the order first given."""
    return list(dict.fromkeys(items))


def _is_report(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("kind") == "gpukit.memprobe"
    except (OSError, ValueError, AttributeError):
        return False


def check_out(path: Path) -> None:
    """Before any trial: the report can be written to `path`, and writing it loses nothing (an existing
    file is overwritten only when it is an earlier memprobe report)."""
    if path.exists():
        if not path.is_file() or not _is_report(path):
            raise GlueError(f"--out {path} exists and is not a memprobe report: choose another path "
                            "(memprobe overwrites only its own reports)")
        if not os.access(path, os.W_OK):
            raise GlueError(f"--out {path} is not writable; choose another path")
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise GlueError(f"--out {path}: {parent} is not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GlueError(f"--out {path}: cannot create files in {parent}; choose another path")


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A run config (run.yaml) whose `config:` is probed.")
@click.option("--run", "run_id", default=None, help="A run in the bucket: probe its manifest's config (under the "
              "memory limit its failed attempt had); the report is saved with the run.")
@click.option("--vary", multiple=True, type=click.Choice(probe_mod.VARIABLES), help="The input to change, one at a "
              "time (repeatable; default batch_size).")
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
              help="K: steps per remedy trial; the loss after K steps is the acceptance check.")
@click.option("--tolerance", type=FiniteFloatRange(min=0, min_open=True), default=0.05, show_default=True,
              metavar="FRACTION", help="Accepted relative difference of the loss after K steps from the reference.")
@click.option("--accum", type=click.IntRange(min=2), default=4, show_default=True, metavar="N",
              help="Micro-batches for the grad_accum remedy.")
@click.option("--remedy", "remedy_names", multiple=True, type=click.Choice(rem.NAMES),
              help="Remedies to compare (repeatable; default all).")
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
def memprobe(config_path: Path | None, run_id: str | None, vary: tuple[str, ...], ranges: tuple[str, ...], grid: str,
             device: str | None, memory_limit_mb: int | None, limit_mechanism: str, sets: tuple[str, ...],
             trial_steps: int, accept_steps: int, tolerance: float, accum: int, remedy_names: tuple[str, ...],
             no_remedies: bool, no_breakdown: bool, remedies_at: int | None, trial_timeout: float,
             out_path: Path | None, as_json: bool) -> None:
    """Out-of-memory investigation: each trial a fresh process with ONE input changed; peak memory and
    whether it fails; the boundary (largest that fits, smallest that fails); the whole step's memory
    by part (weights, gradients, optimizer state, activations); remedies against a loss check."""
    if (config_path is None) == (run_id is None):
        raise GlueError("give exactly one of --config run.yaml or --run RUN")
    if no_remedies and (remedy_names or remedies_at is not None):
        given = "--remedy" if remedy_names else "--remedies-at"
        raise GlueError(f"{given} and --no-remedies contradict each other: drop one")
    store: Any = None
    if run_id is not None:
        src, store = source_mod.from_run(home(), run_id)
    else:
        assert config_path is not None
        src = source_mod.from_config_file(config_path)
    cfg = source_mod.trainer_config(src.trainer_cfg, source_mod.parse_set(sets), where=src.description)
    if device is None:
        device = "cuda" if str(src.failure.get("failure_class")) == "oom_gpu" else str(cfg.get("device") or "cpu")
        device = "cuda" if device.startswith("cuda") else "cpu"
    cfg["device"] = device
    total = total_mb() if device == "cpu" and memory_limit_mb is not None else None
    if total is not None and memory_limit_mb is not None and memory_limit_mb > total:
        raise GlueError(f"--memory-limit-mb {memory_limit_mb} is more than this machine's memory ({total} MB): "
                        f"it would limit nothing; give at most {total}, or leave it out")
    varied = unique(vary) or ["batch_size"]
    limit, limit_source = memory_limit_mb, "--memory-limit-mb"
    if limit is None and src.memory_limit_mb:
        limit, limit_source = src.memory_limit_mb, f"the limit of run {src.run}'s attempt {src.failure.get('attempt')}"
    if limit is None and device == "cpu":
        limit, limit_source = safety_limit_mb(), "90% of this machine's available memory"
    if limit is None:
        limit_source = "the GPU's own capacity"
    stamp = report_mod.utc_stamp()
    default_out = Path(f"memprobe-{stamp}.json")
    local_out = out_path or (default_out if store is None else None)
    if local_out is not None:
        check_out(local_out)
    snapshot = None
    if device == "cuda" and not no_breakdown:  # a CUDA memory snapshot of the profiled step goes with the report
        snapshot = (Path(tempfile.gettempdir()) / f"memprobe-{stamp}.snapshot.pickle" if store is not None
                    else (out_path or default_out).with_suffix(".snapshot.pickle"))

    def progress(what: str, outcome: TrialOutcome | None) -> None:
        if outcome is not None:
            err.print(report_mod.trial_line(what, outcome), highlight=False)

    opts = probe_mod.Options(
        vary=varied, ranges=source_mod.parse_ranges(ranges, varied), grid=grid, device=device,
        memory_limit_mb=limit, limit_source=limit_source, mechanism=limit_mechanism, trial_steps=trial_steps,
        accept_steps=accept_steps, tolerance=tolerance, accum=accum,
        remedies=() if no_remedies else (tuple(unique(remedy_names)) or rem.NAMES), breakdown=not no_breakdown,
        remedies_at=remedies_at, trial_timeout_s=trial_timeout, snapshot_path=snapshot, progress=progress,
    )
    err.print(f"memprobe: {src.description} on {device}; limit: "
              f"{f'{limit} MB' if limit else 'none'} ({limit_source}); varying {', '.join(varied)}")
    import torch

    report: dict[str, Any] = {
        "kind": "gpukit.memprobe", "version": probe_mod.REPORT_VERSION, "created_at": utc_iso(),
        "command": " ".join(["glue", *map(shlex.quote, sys.argv[sys.argv.index("memprobe"):])])
        if "memprobe" in sys.argv else None,
        "source": {"run": src.run, "config": src.config_path, "failure": src.failure or None},
        "device": device, "memory_limit_mb": limit, "limit_source": limit_source, "torch": torch.__version__,
        "config": cfg,
        "options": {"vary": varied, "ranges": opts.ranges, "grid": grid, "trial_steps": trial_steps,
                    "accept_steps": accept_steps, "tolerance": tolerance, "accum": accum,
                    "remedies": list(opts.remedies), "mechanism": limit_mechanism},
    }
    if local_out is not None:
        target = local_out

        def save_partial(partial: dict[str, Any]) -> None:  # what is known so far survives an interrupted probe
            try:
                report_mod.save_local({**report, **partial}, target)
            except OSError:
                pass  # the final save says so, and keeps the report elsewhere

        opts.on_stage = save_partial
    report.update(probe_mod.run(cfg, opts))
    saved: list[str] = []
    unsaved: str | None = None
    if store is not None:
        key = f"memprobe/{stamp}.json"
        if snapshot is not None and snapshot.exists():
            store.put_bytes(f"memprobe/{stamp}.snapshot.pickle", snapshot.read_bytes())
            report["breakdown"]["cuda_snapshot_file"] = f"runs/{src.run}/memprobe/{stamp}.snapshot.pickle"
        store.put_json(key, report)
        saved.append(f"runs/{src.run}/{key} (bucket {store.info.name})")
    if local_out is not None:
        try:
            saved.append(str(report_mod.save_local(report, local_out)))
        except OSError as exc:  # the probe's work is not lost: it goes to the temp directory instead
            fallback = report_mod.save_local(report, Path(tempfile.gettempdir()) / f"memprobe-{stamp}.json")
            saved.append(str(fallback))
            unsaved = f"cannot write {local_out} ({exc.strerror}); the report was saved to {fallback} instead"
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        # a pipe or file gets the whole table, not 80 columns of it
        report_mod.print_report(Console() if sys.stdout.isatty() else Console(width=160), report)
    err.print("saved: " + "; ".join(saved))
    if unsaved is not None:
        raise GlueError(unsaved)


COMMANDS = [memprobe]

"""glue report / compare / budget: see a run, judge it against another, price a whole run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from glue.commands.options import HOURS, POSITIVE_INT, SECONDS
from glue.errors import GlueError
from glue.paths import home
from glue.runs.store import RunStore

err = Console(stderr=True)
out = Console()


@click.command()
@click.option("--run", "run_id", required=True, help="The run to report on.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the HTML (default: ./<run>-report.html).")
@click.option("--open", "open_it", is_flag=True, help="Open the report in the default browser.")
def report(run_id: str, out_path: Path | None, open_it: bool) -> None:
    """One self-contained HTML page (inline SVG, works offline) with the run's loss per attempt, timeline,
    recovery phases, checkpoints, work lost, step gaps, evaluation against thresholds, resources and cost.
    Written locally and beside the run's records in the bucket."""
    from glue.report import facts, html
    from glue.runs.config import check_run_id

    check_run_id(run_id)
    path = out_path or Path(f"{run_id}-report.html")
    if not path.parent.is_dir():
        raise GlueError(f"cannot write the report to {path}: folder {path.parent} does not exist; create it or "
                        "pick another --out")
    store = RunStore.open(home(), run_id)
    with err.status(f"reading run {run_id} from the bucket"):
        page = html.build(facts.gather(store))
    try:
        path.write_text(page)
    except OSError as exc:
        raise GlueError(f"cannot write the report to {path}: {exc.strerror}; pick another --out") from exc
    where = store.put_report(page.encode())
    err.print(f"report: {path} ({len(page) // 1024} KiB) and {where}")
    if open_it:
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            err.print(f"--open: no display here (DISPLAY is not set): open {path} in a browser yourself")
        elif click.launch(str(path.resolve())) != 0:
            err.print(f"--open: no browser could be started: open {path} yourself")


def _num(v: Any, fmt: str = "{:.4g}") -> str:
    return "—" if v is None else fmt.format(v) if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def _metric(side: dict[str, Any], name: str) -> str:
    m = side["metrics"].get(name)
    return "—" if not m else f"{_num(m['value'], '{:.6g}')} ({'pass' if m['passed'] else 'fail'})"


def _workdir(side: dict[str, Any]) -> str:
    sha = side["workdir_sha256"]
    return f"sha256 {sha[:16]}…" if sha else "none (a bundled example)"


@click.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def compare(run_a: str, run_b: str, as_json: bool) -> None:
    """Two runs side by side: config diff, code/input/image versions, evaluation against thresholds, final
    loss, steps, wall time, GPU-hours, cost, recoveries. Refuses runs evaluated on different sets."""
    from glue.report import compare as compare_mod
    from glue.report import facts

    if run_a == run_b:
        raise GlueError(f"compare needs two different runs (got {run_a} twice)")
    h = home()
    with err.status(f"reading runs {run_a} and {run_b} from the bucket"):
        res = compare_mod.compare(facts.gather(RunStore.open(h, run_a), with_reference=False),
                                  facts.gather(RunStore.open(h, run_b), with_reference=False))
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
        return
    a, b = res["a"], res["b"]
    table = Table(box=None)
    table.add_column("")
    table.add_column(run_a)
    table.add_column(run_b)
    rows: list[tuple[str, str, str]] = [
        ("workdir", _workdir(a), _workdir(b)),
        ("gpukit", f"{a['code']}{' (dirty)' if a['dirty'] else ''}", f"{b['code']}{' (dirty)' if b['dirty'] else ''}"),
        ("input", json.dumps(a["input"]), json.dumps(b["input"])),
        ("image", f"{a['image']} {a['image_digest'] or ''}", f"{b['image']} {b['image_digest'] or ''}"),
        ("evaluation set", str(a["eval_set"] or "the trainer's own"), str(b["eval_set"] or "the trainer's own")),
        ("state", a["state"], b["state"]),
        ("accepted", str(a["accepted"]), str(b["accepted"])),
    ]
    for name in sorted(set(a["metrics"]) | set(b["metrics"])):
        rows.append((f"eval {name}", _metric(a, name), _metric(b, name)))
    rows += [("final loss", _num(a["final_loss"], "{:.6g}"), _num(b["final_loss"], "{:.6g}")),
             ("steps", _num(a["steps"]), _num(b["steps"])),
             ("wall time (s)", _num(a["wall_s"], "{:.1f}"), _num(b["wall_s"], "{:.1f}")),
             ("VM-hours", _num(a["vm_hours"], "{:.4f}"), _num(b["vm_hours"], "{:.4f}")),
             ("GPU-hours", _num(a["gpu_hours"], "{:.4f}"), _num(b["gpu_hours"], "{:.4f}")),
             ("cost", f"{_num(a['cost'], '{:.4f}')} {a['currency']}", f"{_num(b['cost'], '{:.4f}')} {b['currency']}"),
             ("attempts / recoveries", f"{a['attempts']} / {a['recoveries']}", f"{b['attempts']} / {b['recoveries']}")]
    for row in rows:
        table.add_row(*row)
    out.print(table)
    if res["config_diff"]:
        diff = Table(title="config differences", box=None)
        for col in ("key", run_a, run_b):
            diff.add_column(col)
        for d in res["config_diff"]:
            diff.add_row(d["key"], json.dumps(d["a"]), json.dumps(d["b"]))
        out.print(diff)
    else:
        out.print("config: identical")


@click.command()
@click.option("--run", "run_id", required=True, help="The run whose measured costs to project from.")
@click.option("--steps", type=POSITIVE_INT, required=True, help="Steps of the full run to price.")
@click.option("--mtbf", type=HOURS, default=None, help="Mean time between failures in hours (default: "
              "measured).")
@click.option("--restore-seconds", type=SECONDS, default=None, help="Override the measured restore cost.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def budget(run_id: str, steps: int, mtbf: float | None, restore_seconds: float | None, as_json: bool) -> None:
    """Projected time and cost of a full run of N steps, expected failures included (the run's measured step
    time, save stall, restore and MTBF, as `glue advise` measures them; formula in docs/report.md)."""
    from glue.report import budget as budget_mod
    from glue.report.cost import money

    store = RunStore.open(home(), run_id)
    with err.status(f"measuring run {run_id}"):
        inputs, sources = budget_mod.inputs_from_run(store, steps, mtbf, restore_seconds)
    res = budget_mod.project(inputs)
    if as_json:
        click.echo(json.dumps({"run": run_id, **res, "sources": sources}, indent=2))
        return
    i = inputs
    out.print(f"run {run_id}: step {i.step_s:.3f} s ({sources['step']}), checkpoint every {i.interval_steps} steps, "
              f"save stall C = {i.save_stall_s:.3f} s, restore R = {i.restore_s:.1f} s ({sources['restore']}), "
              f"MTBF = {i.mtbf_s / 3600:.2f} h ({sources['mtbf']}), {i.vms} VM(s) x {i.gpus_per_vm} GPU(s)")
    table = Table(box=None, show_header=False)
    table.add_row("train", f"{steps} x {i.step_s:.3f} s", f"{res['train_s']:.1f} s")
    table.add_row("checkpoints", f"{steps // i.interval_steps} x {i.save_stall_s:.3f} s",
                  f"{res['checkpoint_s']:.1f} s")
    table.add_row("failures", f"{res['expected_failures']:.3f} expected x {res['lost_per_failure_s']:.1f} s "
                  "(T/2 + R)", f"{res['lost_s']:.1f} s")
    table.add_row("wall", "", f"{res['wall_s']:.1f} s ({res['wall_s'] / 3600:.3f} h)")
    table.add_row("VM-hours / GPU-hours", "", f"{res['vm_hours']:.4f} / {res['gpu_hours']:.4f}")
    table.add_row("cost", sources["price"], money(res["cost"], res["currency"]))
    out.print(table)


COMMANDS: list[click.Command] = [report, compare, budget]

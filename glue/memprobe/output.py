"""Printing a memprobe report as tables, and where its JSON goes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from glue.memprobe.runner import TrialOutcome


def utc_stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _status(status: str) -> str:
    return {"fit": "[green]fits[/]", "oom": "[red]OOM[/]", "error": "[yellow]error[/]",
            "timeout": "[yellow]timeout[/]", "skipped": "[dim]skipped[/]"}.get(status, status)


def trial_line(what: str, o: TrialOutcome) -> str:
    """One progress line per finished trial."""
    peak = f"peak {_f(o.peak_mb)} MB" if o.peak_mb is not None else "peak ?"
    extra = f" in {o.phase}" if o.status == "oom" and o.phase else ""
    err = f" — {o.error}" if o.status not in ("fit", "oom") and o.error else ""
    return f"  {what}: {_status(o.status)}{extra}, {peak}, {_f(o.wall_s)} s{err}"


def print_report(console: Console, report: dict[str, Any]) -> None:
    cuda = report.get("device") == "cuda"
    for s in report["searches"]:
        _print_search(console, s, cuda)
    bd = report.get("breakdown")
    if bd and bd.get("breakdown"):
        _print_breakdown(console, bd)
    elif bd:
        console.print(f"breakdown at {_at(bd['at'])}: {_status(bd['status'])} {bd.get('error') or ''}")
    rm = report.get("remedies")
    if rm and rm.get("items"):
        _print_remedies(console, rm)
    rp = report.get("reproducer")
    if rp:
        console.print(f"reproducer: {rp['command']}", highlight=False, soft_wrap=True)
    for line in report.get("findings", []):
        console.print(f"• {line}", highlight=False)


def _print_search(console: Console, s: dict[str, Any], cuda: bool) -> None:
    """One variable's trials and the boundary they found."""
    t = Table(title=f"{s['vary']}: trials (one variable changed; range {s['range'][0]}:{s['range'][1]}, "
                    f"config {s['config_value']})", title_justify="left")
    t.add_column(s["vary"], justify="right")
    t.add_column("result")
    if cuda:
        t.add_column("max allocated MB", justify="right")
        t.add_column("max reserved MB", justify="right")
    else:
        t.add_column("peak RSS MB", justify="right")
        t.add_column("cgroup peak MB", justify="right")
        t.add_column("runtime RSS MB", justify="right")
    t.add_column("phase", justify="left")
    t.add_column("loss", justify="right")
    t.add_column("s", justify="right")
    for r in s["trials"]:
        gpu = r.get("cuda") or {}
        mem = [_f(gpu.get("max_allocated_mb")), _f(gpu.get("max_reserved_mb"))] if cuda \
            else [_f(r.get("peak_rss_mb")), _f(r.get("cgroup_peak_mb")), _f(r.get("rss_base_mb"))]
        t.add_row(str(r["changed"][s["vary"]]), _status(r["status"]), *mem,
                  r.get("phase") if r["status"] != "fit" else "", _f(r.get("loss_last"), 4), _f(r.get("wall_s")))
    console.print(t)
    console.print(f"boundary: largest that fits [green]{_f(s['largest_fit'])}[/], smallest that fails "
                  f"[red]{_f(s['smallest_fail'])}[/] — {s['trial_count']} trials for {s['candidates']} candidates "
                  f"(bound {s['trial_bound']})")


def _print_breakdown(console: Console, bd: dict[str, Any]) -> None:
    """The profiled step's memory by part and phase, its top ops and the CUDA snapshot."""
    b = bd["breakdown"]
    t = Table(title=f"whole-step memory at {_at(bd['at'])} ({bd['why_here']})", title_justify="left")
    t.add_column("part")
    t.add_column("at the peak MB", justify="right")
    t.add_column("own max MB", justify="right")
    t.add_column("measured directly MB", justify="right")
    res = bd.get("resident") or {}
    direct = {"weights": res.get("weights_mb"), "gradients": res.get("gradients_mb"),
              "optimizer_state": res.get("optimizer_state_mb")}
    own_max = b.get("part_max_mb") or {}
    for part in [p for p in ("weights", "gradients", "optimizer_state", "activations", "inputs", "runtime", "other")
                 if p in b["at_peak_mb"]]:
        t.add_row(part.replace("_", " "), _f(b["at_peak_mb"].get(part), 2), _f(own_max.get(part), 2),
                  _f(direct.get(part), 2))
    t.add_row("[bold]peak (tensors)[/]", f"[bold]{_f(b['peak_mb'], 2)}[/]", "", f"in {b['peak_phase']}")
    console.print(t)
    phases = ", ".join(f"{k} {_f(v, 2)}" for k, v in b.get("phase_peak_mb", {}).items())
    console.print(f"peak by phase (MB): {phases}")
    if b.get("top_ops"):
        _print_top_ops(console, b["top_ops"])
    if bd.get("cuda_snapshot"):
        cs = bd["cuda_snapshot"]
        console.print(f"CUDA snapshot: {cs['segments']} segments, reserved {_f(cs['reserved_mb'])} MB, "
                      f"allocated {_f(cs['allocated_mb'])} MB, largest free block "
                      f"{_f(cs['largest_free_block_mb'])} MB" +
                      (f" ({bd['cuda_snapshot_file']})" if bd.get("cuda_snapshot_file") else ""))


def _print_top_ops(console: Console, top_ops: list[dict[str, Any]]) -> None:
    ops = Table(title="ops that allocated most (profiler, by input shapes)", title_justify="left")
    ops.add_column("op")
    ops.add_column("input shapes")
    ops.add_column("calls", justify="right")
    ops.add_column("MB", justify="right")
    for op in top_ops[:6]:
        ops.add_row(op["op"], op["input_shapes"][:70], str(op["calls"]), _f(op["allocated_mb"], 2))
    console.print(ops)


def _print_remedies(console: Console, rm: dict[str, Any]) -> None:
    """Each remedy tried alone against the configured baseline, and what each one is."""
    ref = rm["reference"]
    t = Table(title=f"remedies at {_at(rm['at'])}, each alone; acceptance: {rm['acceptance']}",
              title_justify="left")
    t.add_column("remedy")
    t.add_column("result")
    t.add_column("peak MB", justify="right")
    t.add_column(f"loss@{rm['steps']}", justify="right")
    t.add_column("Δ vs ref", justify="right")
    t.add_column("accepted")
    base = rm.get("baseline") or {}
    t.add_row("none (as configured)", _status(base.get("status", "?")), _f(base.get("peak_mb")),
              _f(base.get("loss_last"), 4), "", "")
    for r in rm["items"]:
        acc = "" if r["status"] == "skipped" else ("[green]yes[/]" if r.get("accepted") else "[red]no[/]")
        t.add_row(r["name"], _status(r["status"]) + (f" ({r['note']})" if r.get("note") else ""),
                  _f(r.get("peak_mb")), _f(r.get("loss_last"), 4), _f(r.get("loss_delta"), 4), acc)
    console.print(t)
    for r in rm["items"]:
        console.print(f"  {r['name']}: {r['description']}{_judged(r)}", highlight=False)
    console.print(f"reference loss {_f(ref.get('loss'), 4)}: {ref.get('note') or 'none (no reference fit)'}")


def _judged(r: dict[str, Any]) -> str:
    """`; judged by the run's acceptance criteria, on its evaluation at step 3: eval_loss 4.16 (≤ 10) ok`."""
    if not r.get("judged_by"):
        return ""
    checks = ", ".join(f"{c['metric']} {_f(c['value'], 4)} ({c['needs']}) {'ok' if c['passed'] else 'NOT MET'}"
                       for c in r.get("acceptance") or [])
    return f"; judged by {r['judged_by']}" + (f": {checks}" if checks else "")


def _at(at: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in at.items())


def save_local(report: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
    return path

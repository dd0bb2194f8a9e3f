"""`glue report`: one self-contained HTML page about a run: inline SVG and CSS, no script, no network."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from html import escape
from typing import Any

from glue.operations.recovery.resume_check import resume_check_text
from glue.report import svg
from glue.report.cost import Resources, money, resources
from glue.report.facts import RECOVERY_VM_PHASES, RunFacts, when

PHASES = ("detect", "validate", "provision", "configure", "verify", "prepare", "restore", "replay")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:820px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{color:#555;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:600}.bad{color:#c62828;font-weight:600}.muted{color:#777}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.badge.ok{background:#1a7f37;color:#fff}.badge.bad{background:#c62828;color:#fff}
svg.chart{display:block;margin:8px 0;background:#fafafa;border:1px solid #eee}
.ctitle{font-size:13px;font-weight:600}.tick{font-size:11px;fill:#444}.label{font-size:11px;fill:#666}
.axis{stroke:#888}.grid{stroke:#e4e4e4}.bound{stroke:#c62828;stroke-dasharray:2 3}
"""


def _secs(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min" if v < 7200 else f"{v / 3600:.2f} h"


def _table(rows: list[list[str]], head: list[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


def _t0(f: RunFacts) -> datetime | None:
    starts = [a.started for a in f.attempts if a.started]
    return min(starts) if starts else None


def _since(t0: datetime | None, t: datetime | None) -> float | None:
    return None if t0 is None or t is None else (t - t0).total_seconds()


def loss_chart(f: RunFacts) -> str:
    series: list[svg.Series] = []
    if f.reference:
        series.append(svg.Series(f"reference {f.reference_run}", [(p.step, p.loss) for p in f.reference],
                                 color="#999999", dash=True))
    last = f.attempts[-1].n if f.attempts else 0
    for a in f.attempts:
        if not a.steps:
            continue
        role = "resumed" if a.resume else "first"
        role += ", lost" if a.n != last and a.state not in ("completed", "running") else ""
        # Later attempts are drawn last, so a resumed segment lies over the pre-failure one it replays.
        series.append(svg.Series(f"attempt {a.n} ({role})", [(p.step, p.loss) for p in a.steps]))
    return svg.line_chart("loss", "Training loss per step, per attempt", series, "step", "loss")


def timeline_chart(f: RunFacts) -> str:
    t0 = _t0(f)
    spans: list[svg.Span] = []
    marks: list[svg.Mark] = []
    lanes: list[str] = []

    def lane(name: str) -> str:
        if name not in lanes:
            lanes.append(name)
        return name

    for a in f.attempts:
        start, end = _since(t0, a.started), _since(t0, a.ended or datetime.now(UTC))
        if start is None or end is None:
            continue
        vm = lane(f"VM {a.vm}" if a.vm else "VM ?")
        spans.append(svg.Span(vm, start, end, "attempt", f"attempt {a.n} on {a.vm} ({a.state})"))
        if a.state not in ("completed", "running", ""):
            marks.append(svg.Mark(vm, end, "failure", f"attempt {a.n}: {a.state}"))
        for p in a.steps:
            at = _since(t0, p.t)
            if at is not None and p.step % f.interval_steps == 0:
                marks.append(svg.Mark(vm, at, "checkpoint", f"checkpoint at step {p.step} (attempt {a.n})"))
    by_n = {a.n: a for a in f.attempts}
    for k, rec in enumerate(f.recoveries, 1):
        new = by_n.get(rec.new_attempt)
        end = _since(t0, new.started) if new else None
        if end is None:
            continue
        secs = rec.seconds
        before = sum(float(secs.get(p) or 0) for p in ("detect", "validate", *RECOVERY_VM_PHASES))
        spans.append(svg.Span(lane("recovery"), end - before, end, "recovery",
                              f"recovery {k}: {rec.failure_class} -> attempt {rec.new_attempt}"))
    horizon = max([s.end for s in spans], default=0.0)
    for ev in f.evaluations:
        at = _since(t0, when(ev.get("at")))
        if at is not None and 0 <= at <= horizon:  # one recorded later (a re-evaluation) is in the table only
            marks.append(svg.Mark(lane("evaluation"), at, "evaluation", f"evaluation at step {ev.get('step')}"))
    return svg.timeline("timeline", "Attempts, VMs, failures, recoveries, checkpoints", lanes, spans, marks)


def recovery_chart(f: RunFacts) -> str:
    rows = [f"recovery {k}" for k in range(1, len(f.recoveries) + 1)]
    # `prepare` is timed only for a run with a workdir or requirements: a phase no recovery had is not drawn.
    shown = [p for p in PHASES if any(p in r.seconds for r in f.recoveries)]
    stacks = [svg.Bars(p, [float(r.seconds.get(p) or 0) for r in f.recoveries]) for p in shown]
    return svg.bar_chart("recovery-phases", "Where recovery time went (seconds per phase)", rows, stacks, "seconds")


def recovery_checks(f: RunFacts) -> str:
    if not f.recoveries:
        return ""
    return _table([[f"recovery {k}", escape(resume_check_text(r))] for k, r in enumerate(f.recoveries, 1)],
                  ["recovery", "resume check"])


def checkpoint_charts(f: RunFacts) -> str:
    rows = [f"step {c.step}" for c in f.checkpoints]
    stall = svg.bar_chart("checkpoint-stall", "Checkpoint cost: training stall and background save", rows,
                          [svg.Bars("stall (training waits)", [c.stall_s for c in f.checkpoints]),
                           svg.Bars("background (serialize, upload, verify)", [c.full_s for c in f.checkpoints])],
                          "seconds")
    size = svg.bar_chart("checkpoint-size", "Checkpoint size", rows,
                         [svg.Bars("size", [c.bytes / 2**20 for c in f.checkpoints], color="#2ca02c")], "MiB")
    return stall + size


def work_lost_chart(f: RunFacts) -> str:
    rows = [f"failure {k} ({r.failure_class})" for k, r in enumerate(f.recoveries, 1)]
    stacks = [svg.Bars("training replayed", [float(r.work_lost.get("seconds") or 0)
                                            for r in f.recoveries], color="#d62728"),
              svg.Bars("restore", [float(r.seconds.get("restore") or 0) for r in f.recoveries],
                       color="#ff7f0e")]
    return svg.bar_chart("work-lost", "Work lost per failure", rows, stacks, "seconds")


def gaps_chart(f: RunFacts) -> tuple[str, list[list[str]]]:
    gaps = f.step_gaps()
    series = [svg.Series(f"attempt {a.n}", [(g.after_step, g.seconds) for g in gaps if g.attempt == a.n])
              for a in f.attempts]
    chart = svg.line_chart("step-gaps", "Seconds between consecutive steps (heartbeat gaps show as spikes)",
                           [s for s in series if s.points], "step", "seconds")
    median = statistics.median([g.seconds for g in gaps]) if gaps else 0.0
    hb = float(f.manifest.monitor.get("heartbeat_seconds") or 2)
    limit = max(3 * median, 2 * hb)
    rows = [[f"attempt {g.attempt}", f"after step {g.after_step}", _secs(g.seconds)]
            for g in sorted(gaps, key=lambda g: -g.seconds) if g.seconds > limit][:10]
    return chart, rows


def evaluation_section(f: RunFacts) -> str:
    v = f.acceptance
    bands = [(0.0, m.min, m.max, m.name) for m in v.metrics]
    # The metrics with acceptance bounds (when there are any): one scale, and the ones the verdict is about.
    names = [m.name for m in v.metrics] or sorted({n for ev in f.evaluations for n in (ev.get("metrics") or {})})
    series = [svg.Series(n, [(float(ev["step"]), float(ev["metrics"][n])) for ev in f.evaluations
                             if n in (ev.get("metrics") or {})], markers=True) for n in names]
    chart = svg.line_chart("evaluation", "Evaluation metrics (red: acceptance bounds)", series, "step", "value",
                           bands=bands, x_from_zero=True)
    rows = [[escape(m.name), "—" if m.value is None else f"{m.value:.6g}", escape(m.bounds()),
             '<span class="ok">pass</span>' if m.passed else '<span class="bad">fail</span>'] for m in v.metrics]
    pin = f.manifest.evaluation.get("dataset") or {}
    where = f"evaluation set {escape(str(pin.get('uri')))} (sha256 {escape(str(pin.get('sha256'))[:16])}…)" if pin \
        else "evaluation set: the trainer's own (none pinned in run.yaml, evaluation.dataset)"
    return f"<p class='muted'>{where}</p>" + chart + (_table(rows, ["metric", "final", "needs", ""]) if rows else
                                                      "<p>No acceptance criteria in run.yaml (evaluation.metrics).</p>")


def cost_section(r: Resources) -> str:
    cur = r.price.currency
    rows = [[escape(u.label), _secs(u.seconds), str(u.vms), f"{u.vm_hours:.4f}", f"{u.gpu_hours:.4f}",
             money(u.cost, cur)] for u in r.uses]
    rows.append(["<b>total</b>", "", "", f"<b>{r.vm_hours:.4f}</b>", f"<b>{r.gpu_hours:.4f}</b>",
                 f"<b>{money(r.cost, cur)}</b>"])
    price = "unknown" if r.price.vm_hour is None else f"{r.price.vm_hour:g} {cur} per VM-hour"
    return (_table(rows, ["", "time", "VMs", "VM-hours", "GPU-hours", "cost"])
            + f"<p>Price: {escape(price)} ({escape(r.price.source)}). Replayed after failures: "
            f"{r.replayed_steps} steps ({_secs(r.replayed_s)}). Checkpoint overhead: {r.saves} saves, "
            f"{_secs(r.checkpoint_overhead_s)} of training stall.</p>")


def code_line(workdir: dict[str, Any] | None, gpukit: dict[str, Any]) -> str:
    """What ran: the user's workdir by content hash (and its repository's commit), else gpukit's own checkout
    (the bundled examples); gpukit's commit is said either way."""
    kit = f"gpukit {gpukit.get('git_sha') or '?'}" + (" (dirty)" if gpukit.get("dirty") else "")
    if not workdir:
        return kit
    git = workdir.get("git") or {}
    repo = f", commit {git['commit']}" + (" (dirty)" if git.get("dirty") else "") if git.get("commit") else ""
    return (f"workdir {workdir.get('path') or '?'} sha256 {str(workdir.get('sha256'))[:16]}… "
            f"({workdir.get('files')} files{repo}); {kit}")


def input_line(spec: dict[str, Any] | None) -> str:
    if not spec or not spec.get("uri"):
        return "none pinned in run.yaml (input:)"
    return str(spec["uri"]) + (f" version {spec['version']}" if spec.get("version") else "")


def build(f: RunFacts) -> str:
    res = resources(f)
    v = f.acceptance
    m = f.manifest
    code = m.code or {}
    badge = '<span class="badge ok">accepted</span>' if v.accepted else '<span class="badge bad">not accepted</span>'
    head = _table([
        ["verdict", badge + ("" if v.accepted else " " + escape("; ".join(v.reasons)))],
        ["state", escape(v.state)],
        ["code", escape(code_line(m.workdir, code))],
        ["input", escape(input_line(m.input))],
        ["image", escape(str(m.image or "process runtime") + (f" {m.image_digest}" if m.image_digest else ""))],
        ["created", escape(str(m.created_at))],
        ["steps", f"{f.final_step} (final loss {f.final_loss:.6g})" if f.final_loss is not None else "—"],
        ["attempts / recoveries", f"{len(f.attempts)} / {len(f.recoveries)}"],
        ["wall time", _secs(f.wall_s())],
        ["VM-hours / GPU-hours / cost", f"{res.vm_hours:.4f} / {res.gpu_hours:.4f} / "
                                        f"{escape(money(res.cost, res.price.currency))}"],
    ])
    drill = ""
    if f.drill:
        d = f.drill
        ok = '<span class="ok">PASS</span>' if d.get("passed") else f'<span class="bad">FAIL</span> ' \
            f'{escape(str(d.get("problem")))}'
        drill = "<h2>Drill</h2>" + _table([
            ["reference run", escape(str(d.get("ref_run")))], ["VM destroyed at step", str(d.get("destroyed_at"))],
            ["resumed from checkpoint", str((d.get("recovery") or {}).get("checkpoint_step"))],
            ["per-step losses compared", str(d.get("compared_steps"))],
            ["final tensors compared", str(d.get("compared_tensors"))],
            ["check applied", escape(str(d.get("check") or "bitwise (same world size)"))], ["verdict", ok]])
    gaps, gap_rows = gaps_chart(f)
    incidents = _table([[escape(str(i.get("detected_at") or i.get("at") or "")), escape(str(i.get("attempt", ""))),
                         escape(str(i.get("class", ""))), escape(str(i.get("reason") or i.get("what") or ""))[:200]]
                        for i in f.incidents], ["detected", "attempt", "class", "reason"]) if f.incidents else \
        "<p>No incidents.</p>"
    body = [
        f"<h1>Run {escape(f.run)}</h1>", head, drill,
        "<h2>Loss</h2>", loss_chart(f),
        "<h2>Timeline</h2>", timeline_chart(f),
        "<h2>Recovery</h2>", recovery_checks(f), recovery_chart(f), work_lost_chart(f),
        "<h2>Checkpoints</h2>", checkpoint_charts(f),
        "<h2>Heartbeat and step gaps</h2>", gaps,
        _table(gap_rows, ["attempt", "where", "gap"]) if gap_rows else "<p>No gap above 3 times the median step.</p>",
        "<h2>Evaluation and acceptance</h2>", evaluation_section(f),
        "<h2>Resources and cost</h2>", cost_section(res),
        "<h2>Incidents</h2>", incidents,
    ]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>gpukit run {escape(f.run)}</title><style>{CSS}</style></head><body>"
            + "".join(body) + "</body></html>\n")

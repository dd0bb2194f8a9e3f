"""Small inline-SVG charts for the report: line, horizontal stacked bars, and a timeline.

Inline SVG keeps the report one self-contained file that opens offline with no JavaScript. Every chart is
`<svg data-chart="ID">` and every series a `<g data-series="NAME" data-points="N">`, so a test (and a
curious user) can check from the DOM that each chart holds the data it claims.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
W, H = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 130, 16, 44, 44  # room for lane labels; legend under the title


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str = ""
    dash: bool = False
    markers: bool = False


@dataclass
class Bars:
    name: str
    values: list[float]  # one per row; 0 = nothing
    color: str = ""


@dataclass
class Span:
    lane: str
    start: float
    end: float
    kind: str
    label: str


@dataclass
class Mark:
    lane: str
    at: float
    kind: str
    label: str


@dataclass
class Frame:
    x0: float
    x1: float
    y0: float
    y1: float
    width: int = W
    height: int = H
    parts: list[str] = field(default_factory=list)

    def x(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (v - self.x0) / span * (self.width - LEFT - RIGHT)

    def y(self, v: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return self.height - BOTTOM - (v - self.y0) / span * (self.height - TOP - BOTTOM)


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round numbers spanning lo..hi."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + k * step, 10) for k in range(int((hi - first) / step + 1e-9) + 1)]


def fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3g}"


def _open(chart_id: str, title: str, width: int = W, height: int = H) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{escape(chart_id)}" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
            f'<title>{escape(title)}</title>'
            f'<text x="{LEFT}" y="16" class="ctitle">{escape(title)}</text>')


def _axes(f: Frame, x_label: str, y_label: str, y_ticks: bool = True) -> None:
    for t in ticks(f.x0, f.x1):
        base = f.height - BOTTOM
        f.parts.append(f'<line x1="{f.x(t):.1f}" y1="{base}" x2="{f.x(t):.1f}" y2="{base + 4}" class="axis"/>'
                       f'<text x="{f.x(t):.1f}" y="{f.height - BOTTOM + 16}" class="tick" '
                       f'text-anchor="middle">{fmt(t)}</text>')
    if y_ticks:
        for t in ticks(f.y0, f.y1):
            f.parts.append(f'<line x1="{LEFT}" y1="{f.y(t):.1f}" x2="{f.width - RIGHT}" y2="{f.y(t):.1f}" '
                           'class="grid"/>'
                           f'<text x="{LEFT - 6}" y="{f.y(t) + 4:.1f}" class="tick" text-anchor="end">{fmt(t)}</text>')
    f.parts.append(f'<line x1="{LEFT}" y1="{f.height - BOTTOM}" x2="{f.width - RIGHT}" y2="{f.height - BOTTOM}" '
                   f'class="axis"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{f.height - BOTTOM}" class="axis"/>'
                   f'<text x="{(LEFT + f.width - RIGHT) / 2}" y="{f.height - 8}" class="label" '
                   f'text-anchor="middle">{escape(x_label)}</text>'
                   f'<text x="14" y="{(TOP + f.height - BOTTOM) / 2}" class="label" text-anchor="middle" '
                   f'transform="rotate(-90 14 {(TOP + f.height - BOTTOM) / 2})">{escape(y_label)}</text>')


def _legend(names: Sequence[tuple[str, str, bool]], width: int = W) -> str:
    out, x = [], LEFT
    for name, color, dash in names:
        style = ' stroke-dasharray="5 3"' if dash else ""
        out.append(f'<line x1="{x}" y1="30" x2="{x + 18}" y2="30" stroke="{color}" stroke-width="3"{style}/>'
                   f'<text x="{x + 22}" y="34" class="tick">{escape(name)}</text>')
        x += 30 + 7 * len(name)
        if x > width - 60:
            break
    return "".join(out)


def empty(chart_id: str, title: str, why: str) -> str:
    return (_open(chart_id, title, W, 60).replace('class="chart"', 'class="chart" data-empty="true"')
            + f'<text x="{LEFT}" y="44" class="tick">{escape(why)}</text></svg>')


MAX_DRAWN = 2000  # per series: a long run's million steps would make a page no browser wants to open


def thin(points: list[tuple[float, float]], limit: int = MAX_DRAWN) -> list[tuple[float, float]]:
    """At most `limit` points, evenly spaced along the series, the first and last always kept."""
    if len(points) <= limit:
        return points
    stride = (len(points) - 1) / (limit - 1)
    return [points[round(k * stride)] for k in range(limit)]


def line_chart(chart_id: str, title: str, series: list[Series], x_label: str, y_label: str,
               bands: Sequence[tuple[float, float | None, float | None, str]] = (), x_from_zero: bool = False) -> str:
    """Lines over a shared x axis. `bands`: (x, y_min, y_max, label) acceptance bounds drawn as lines."""
    pts = [p for s in series for p in s.points]
    if not pts:
        return empty(chart_id, title, "no data recorded")
    xs, ys = [p[0] for p in pts] + ([0.0] if x_from_zero else []), [p[1] for p in pts]
    ys += [v for _, lo, hi, _ in bands for v in (lo, hi) if v is not None]
    pad = (max(ys) - min(ys)) * 0.05 or abs(max(ys)) * 0.05 or 1.0
    f = Frame(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, min(ys) - pad, max(ys) + pad)
    _axes(f, x_label, y_label)
    for _x, lo, hi, label in bands:
        for v, kind in ((lo, "min"), (hi, "max")):
            if v is not None:
                f.parts.append(f'<line x1="{LEFT}" y1="{f.y(v):.1f}" x2="{f.width - RIGHT}" y2="{f.y(v):.1f}" '
                               f'class="bound"><title>{escape(label)} {kind} {fmt(v)}</title></line>'
                               f'<text x="{f.width - RIGHT - 4}" y="{f.y(v) - 4:.1f}" class="tick" '
                               f'text-anchor="end">{escape(label)} {kind} {fmt(v)}</text>')
    legend = []
    for k, s in enumerate(series):
        color = s.color or PALETTE[k % len(PALETTE)]
        legend.append((s.name, color, s.dash))
        drawn = thin(s.points)
        coords = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in drawn)
        dash = ' stroke-dasharray="5 3"' if s.dash else ""
        body = f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>' \
            if len(s.points) > 1 and not s.markers else ""
        if s.markers or len(s.points) == 1:
            body += "".join(f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="3.5" fill="{color}">'
                            f'<title>{escape(s.name)}: {fmt(x)}, {fmt(y)}</title></circle>' for x, y in drawn)
        f.parts.append(f'<g data-series="{escape(s.name)}" data-points="{len(s.points)}" '
                       f'data-drawn="{len(drawn)}"><title>{escape(s.name)}</title>{body}</g>')
    return _open(chart_id, title) + _legend(legend) + "".join(f.parts) + "</svg>"


def bar_chart(chart_id: str, title: str, rows: list[str], stacks: list[Bars], unit: str) -> str:
    """One horizontal bar per row, stacked by series (e.g. recovery phases per recovery)."""
    totals = [sum(b.values[i] for b in stacks) for i in range(len(rows))]
    if not rows or not any(totals):
        return empty(chart_id, title, "no data recorded")
    height = TOP + BOTTOM + 26 * len(rows) + 8
    f = Frame(0, max(totals) * 1.08, 0, 1, height=height)
    _axes(f, unit, "", y_ticks=False)
    legend = []
    for k, b in enumerate(stacks):
        color = b.color or PALETTE[k % len(PALETTE)]
        legend.append((b.name, color, False))
        rects = []
        for i, v in enumerate(b.values):
            if v <= 0:
                continue
            start = sum(s.values[i] for s in stacks[:k])
            y = TOP + 6 + 26 * i
            rects.append(f'<rect x="{f.x(start):.1f}" y="{y}" width="{max(f.x(start + v) - f.x(start), 0.5):.1f}" '
                         f'height="18" fill="{color}"><title>{escape(rows[i])} {escape(b.name)}: {fmt(v)} '
                         f'{escape(unit)}</title></rect>')
        f.parts.append(f'<g data-series="{escape(b.name)}" data-points="{len(rects)}">{"".join(rects)}</g>')
    labels = "".join(f'<text x="{LEFT - 6}" y="{TOP + 19 + 26 * i}" class="tick" text-anchor="end">{escape(r)}</text>'
                     for i, r in enumerate(rows))
    return _open(chart_id, title, W, height) + _legend(legend) + labels + "".join(f.parts) + "</svg>"


KIND_COLOR = {"attempt": "#1f77b4", "recovery": "#ff7f0e", "failure": "#d62728", "checkpoint": "#2ca02c",
              "evaluation": "#9467bd"}


def timeline(chart_id: str, title: str, lanes: list[str], spans: list[Span], marks: list[Mark]) -> str:
    """Spans (attempts, recoveries) and instants (failures, checkpoints) on lanes, over seconds from the start."""
    times = [t for s in spans for t in (s.start, s.end)] + [m.at for m in marks]
    if not lanes or not times:
        return empty(chart_id, title, "no data recorded")
    height = TOP + BOTTOM + 30 * len(lanes) + 8
    f = Frame(min(0.0, min(times)), max(times) or 1.0, 0, 1, height=height)
    _axes(f, "seconds since the run started", "", y_ticks=False)
    lane_y = {lane: TOP + 6 + 30 * i for i, lane in enumerate(lanes)}
    kinds = sorted({s.kind for s in spans} | {m.kind for m in marks}, key=list(KIND_COLOR).index)
    for kind in kinds:
        items = []
        for s in (s for s in spans if s.kind == kind):
            y = lane_y[s.lane]
            items.append(f'<rect x="{f.x(s.start):.1f}" y="{y}" width="{max(f.x(s.end) - f.x(s.start), 1.5):.1f}" '
                         f'height="20" rx="3" fill="{KIND_COLOR[kind]}" opacity="0.8"><title>{escape(s.label)} '
                         f'({fmt(s.start)} to {fmt(s.end)} s)</title></rect>')
        for m in (m for m in marks if m.kind == kind):
            x, y = f.x(m.at), lane_y[m.lane]
            shape = (f'<path d="M{x - 6:.1f},{y - 2} L{x + 6:.1f},{y + 22} M{x + 6:.1f},{y - 2} L{x - 6:.1f},{y + 22}" '
                     f'stroke="{KIND_COLOR[kind]}" stroke-width="3"' if kind == "failure" else
                     f'<path d="M{x:.1f},{y + 2} l5,8 l-5,8 l-5,-8 z" fill="{KIND_COLOR[kind]}" stroke="#fff"')
            items.append(f'{shape}><title>{escape(m.label)} at {fmt(m.at)} s</title></path>')
        f.parts.append(f'<g data-series="{kind}" data-points="{len(items)}">{"".join(items)}</g>')
    labels = "".join(f'<text x="{LEFT - 6}" y="{y + 14}" class="tick" text-anchor="end">{escape(lane)}</text>'
                     for lane, y in lane_y.items())
    legend = [(k, KIND_COLOR[k], False) for k in kinds]
    return _open(chart_id, title, W, height) + _legend(legend) + labels + "".join(f.parts) + "</svg>"

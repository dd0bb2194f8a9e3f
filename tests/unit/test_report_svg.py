"""The report's charts: series counts in the DOM, long series thinned, round axis ticks, text escaped."""

from __future__ import annotations

import re

from glue.report import svg


def test_a_long_series_is_drawn_thinned_but_counted_whole() -> None:
    points = [(float(s), 1.0 / s) for s in range(1, 100_001)]
    out = svg.line_chart("loss", "loss", [svg.Series("attempt 1", points)], "step", "loss")
    assert 'data-series="attempt 1" data-points="100000" data-drawn="2000"' in out
    drawn = re.search(r'<polyline points="([^"]+)"', out)
    assert drawn and len(drawn.group(1).split()) == 2000
    assert svg.thin(points)[0] == points[0] and svg.thin(points)[-1] == points[-1]


def test_ticks_are_round_and_cover_the_range() -> None:
    assert svg.ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert svg.ticks(2.43, 3.41) == [2.6, 2.8, 3.0, 3.2, 3.4]


def test_names_are_escaped_and_empty_charts_say_so() -> None:
    out = svg.bar_chart("phases", "<b>", ["r<1>"], [svg.Bars('a"b', [1.0])], "s")
    assert "<b>" not in out and "r&lt;1&gt;" in out and 'data-series="a&quot;b" data-points="1"' in out
    assert 'data-empty="true"' in svg.line_chart("evaluation", "e", [], "step", "v")

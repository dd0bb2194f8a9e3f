"""Parameter types shared by the commands: a bad number is one line from click, before anything runs."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (click lets them through a range with no max, and a
    nan tolerance would pass every comparison)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


POSITIVE_INT = click.IntRange(min=1)
POSITIVE_FLOAT = FiniteFloatRange(min=0, min_open=True)
NON_NEGATIVE = FiniteFloatRange(min=0)
# Durations: beyond these a sleep or a timestamp overflows, and nobody means them.
POLL_SECONDS = FiniteFloatRange(min=0, min_open=True, max=3600)
HOURS = FiniteFloatRange(min=0, min_open=True, max=1e6)
SECONDS = FiniteFloatRange(min=0, max=1e7)

"""The boundary search: the largest input that fits and the smallest that fails, in few trials.

The candidates are an ordered sequence of input values (every integer of `--range LO:HI`, or only
its powers of two). Memory need is assumed to grow with the input, so the outcomes look like
fit … fit | fail … fail and one split point is sought. The first trial is the start hint (the
config's own value: does it reproduce?), then plain bisection of the side that still holds the
split. A bisection over m unknown candidates needs ceil(log2(m + 1)) trials, so the whole search
needs at most floor(log2(N)) + 2 trials for N candidates (`trial_bound`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FIT = "fit"
OOM = "oom"


@dataclass
class Boundary:
    """What a search found. `stopped` says why it ended early (a trial that neither fit nor ran out
    of memory: the split cannot be placed past it)."""

    largest_fit: int | None = None
    smallest_fail: int | None = None
    probed: list[tuple[int, str]] = field(default_factory=list)
    stopped: str | None = None

    @property
    def trials(self) -> int:
        return len(self.probed)


def trial_bound(n_candidates: int) -> int:
    """The most trials `find_boundary` may use for n candidates: floor(log2(n)) + 2."""
    return math.floor(math.log2(max(1, n_candidates))) + 2


def candidates(lo: int, hi: int, grid: str = "int") -> Sequence[int]:
    """The values a search may try: every integer in [lo, hi], or (grid "pow2") lo·2^k up to hi."""
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= lo <= hi, got {lo}:{hi}")
    if grid == "int":
        return range(lo, hi + 1)
    if grid == "pow2":
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= 2
        return out
    raise ValueError(f"unknown grid {grid!r} (int or pow2)")


def find_boundary(probe: Callable[[int], str], values: Sequence[int], start: int | None = None) -> Boundary:
    """Bisect `values` (ascending) for the fit/fail split. `probe(v)` returns FIT, OOM or anything
    else (an error: the search stops there). `start`, if it is one of the values, is tried first."""
    result = Boundary()
    fit_i, fail_i = -1, len(values)  # indices known to fit / fail (virtual beyond both ends)
    nxt: int | None = None
    if start is not None and len(values):
        i = bisect.bisect_left(values, start)  # the value closest to start (values are ascending)
        nxt = i - 1 if i == len(values) or (i > 0 and start - values[i - 1] < values[i] - start) else i
    while fail_i - fit_i > 1:
        i = nxt if nxt is not None else (fit_i + fail_i) // 2
        nxt = None
        value = values[i]
        outcome = probe(value)
        result.probed.append((value, outcome))
        if outcome == FIT:
            fit_i = i
        elif outcome == OOM:
            fail_i = i
        else:
            result.stopped = f"{outcome} at {value}"
            break
    result.largest_fit = values[fit_i] if fit_i >= 0 else None
    result.smallest_fail = values[fail_i] if fail_i < len(values) else None
    return result

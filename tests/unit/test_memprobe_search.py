"""memprobe's boundary search: right answer, and never more than log2(range) + 2 trials."""

from __future__ import annotations

import math

import pytest

from glue.memprobe.search import FIT, OOM, candidates, find_boundary, trial_bound


def fake_probe(split: int, calls: list[int]):
    """Fits below `split`, fails from `split` on."""

    def probe(value: int) -> str:
        calls.append(value)
        return FIT if value < split else OOM

    return probe


@pytest.mark.parametrize("grid", ["int", "pow2"])
def test_boundary_is_exact_and_within_the_trial_bound(grid: str) -> None:
    worst = 0
    for lo, hi in [(1, 1), (1, 2), (1, 7), (1, 64), (3, 100), (1, 1000), (16, 4096)]:
        values = candidates(lo, hi, grid)
        n = len(values)
        every = max(1, n // 150)  # every split point of the small ranges, a sample of the big ones
        for split in [values[0] - 1, *values[::every], values[-1], values[-1] + 1]:
            for start in (None, values[0], values[len(values) // 2], values[-1], (lo + hi) // 3):
                calls: list[int] = []
                b = find_boundary(fake_probe(split, calls), values, start=start)
                fits = [v for v in values if v < split]
                fails = [v for v in values if v >= split]
                assert b.largest_fit == (fits[-1] if fits else None)
                assert b.smallest_fail == (fails[0] if fails else None)
                assert b.trials == len(calls) == len(set(calls)), "a value was tried twice"
                assert b.trials <= trial_bound(n) <= math.log2(n) + 2, (lo, hi, split, start, calls)
                worst = max(worst, b.trials - math.log2(n))
                if start in values:
                    assert calls[0] == start, "the config's own value is tried first"
    assert worst <= 2


def test_range_1_to_128_from_the_config_value() -> None:
    calls: list[int] = []
    b = find_boundary(fake_probe(65, calls), candidates(1, 128), start=64)
    assert (b.largest_fit, b.smallest_fail) == (64, 65)
    assert calls[0] == 64 and len(calls) <= math.log2(128) + 2


def test_an_error_stops_the_search_and_says_where() -> None:
    def probe(value: int) -> str:
        return "error" if value >= 40 else FIT

    b = find_boundary(probe, candidates(1, 100), start=10)
    assert b.stopped == "error at 55" or b.stopped.startswith("error at ")
    assert b.largest_fit == 10 and b.smallest_fail is None


def test_candidates() -> None:
    assert list(candidates(3, 40, "pow2")) == [3, 6, 12, 24]
    assert len(candidates(1, 10**9)) == 10**9  # a range, not a list
    with pytest.raises(ValueError):
        candidates(0, 4)
    with pytest.raises(ValueError):
        candidates(1, 4, "fib")

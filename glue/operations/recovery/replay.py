"""The replay phase: wait until the resumed attempt has passed the step its resume is checked at, with
every step from the expected first resumed step visible in the bucket."""

from __future__ import annotations

import time
from typing import Any

from glue.errors import GlueError
from glue.runs.store import RunStore

# A metrics part whose PUT is still in flight (slow under load) hides its steps while later ones are visible
# already (a later part, the heartbeat's recent steps): a resume would look as if it started late. Waiting
# this long for the gap to fill tells that apart from a resume that really started late.
SETTLE_S = 20.0


def steps_complete(steps: dict[int, Any], first: int, upto: int) -> bool:
    """Every step from the expected first resumed step through `upto` is visible."""
    return all(s in steps for s in range(first, upto + 1))


def replay(store: RunStore, attempt: int, upto: int, timeout: float, first: int = 1) -> dict[int, Any]:
    """Wait until the resumed attempt passes `upto` with every step from `first` (the expected first resumed
    step) visible, or SETTLE_S after it passed `upto` with a gap (then the check judges the gap), or until it
    exits 0 first; its rank-0 steps."""
    deadline = time.monotonic() + timeout
    steps: dict[int, Any] = {}
    settle: float | None = None
    while time.monotonic() < deadline:
        steps = store.metrics().get(attempt, {})
        if steps and max(steps) >= upto:
            settle = settle or time.monotonic() + SETTLE_S
            if steps_complete(steps, first, upto) or time.monotonic() >= settle:
                return steps
            time.sleep(0.5)
            continue
        exit_rec = store.exit_record(attempt)
        if exit_rec is not None:
            time.sleep(0.5)
            steps = store.metrics().get(attempt, {})
            if exit_rec.get("exit_code") != 0:
                raise GlueError(f"the resumed attempt {attempt} of run {store.run} failed (exit "
                                f"{exit_rec.get('exit_code')}, signal {exit_rec.get('signal')}); "
                                f"see `glue incidents --run {store.run}`")
            return steps
        time.sleep(0.5)
    raise GlueError(f"the resumed attempt {attempt} of run {store.run} did not reach step {upto} within "
                    f"{timeout:.0f}s; check `glue status --run {store.run}`")


def rank_steps(store: RunStore, attempt: int, rank: int, first: int, upto: int,
               settle_s: float = SETTLE_S) -> dict[int, Any]:
    """A rank other than 0 ships its metrics parts on its own, so one may still be in flight when rank 0 has
    passed `upto`: that rank's steps of `attempt` once every step from `first` through `upto` is visible, or
    what is visible after `settle_s` (the check then judges the gap)."""
    deadline = time.monotonic() + settle_s
    while True:
        steps = store.metrics(rank).get(attempt, {})
        if steps_complete(steps, first, upto) or time.monotonic() >= deadline:
            return steps
        time.sleep(0.5)

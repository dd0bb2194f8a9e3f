"""What the benches wait on: a condition within a deadline (the bench stops in one line past it), and a run's
step as its latest heartbeat has it."""

from __future__ import annotations

import time
from typing import Any

from glue.runs.store import RunStore


def until(what: str, pred: Any, timeout: float = 300, every: float = 0.1) -> Any:
    """pred()'s first truthy answer; past `timeout` seconds the bench exits naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise SystemExit(f"bench: timed out waiting for {what}")


def step_of(store: RunStore, attempt: int) -> int:
    """The step attempt `attempt` reached by its latest heartbeat (0 before it beat, or after another did)."""
    beat = store.heartbeat() or {}
    return int(beat.get("step") or 0) if beat.get("attempt") == attempt else 0

"""A serverless attempt's execution (glue.runs.serverless) as the monitor, recovery and `glue logs` see it:
its state, its platform log, and its abort. Below the monitor (which reads it), above the Lyceum client."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from glue.cloud.lyceum.api import LyceumClient
from glue.cloud.lyceum.executions import ACTIVE, Execution, Executions
from glue.runs.records import AttemptRecord


def is_serverless(attempt: AttemptRecord) -> bool:
    return bool(attempt.execution)


def executions() -> Executions:
    return Executions(LyceumClient.from_env())


# An execution that ended by itself (its process exited: completed, failed) wrote its exit record first, but
# through the run's bucket mount, which may show it to S3 a moment later than the platform reports the end
# (the emulator's listing: up to 1 s). Read too early, a finished attempt would look lost under its trainer.
SELF_ENDED = frozenset({"completed", "failed"})
EXIT_SETTLE_S = 10.0
EXIT_POLL_S = 0.25


def settled_exit(ex: Execution | None, read: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """The attempt's exit record; for an execution that ended by itself, waited for up to EXIT_SETTLE_S (None
    after that: it ended without one). Never waits for one still running or ended by the platform."""
    record = read()
    if record is not None or ex is None or ex.state not in SELF_ENDED:
        return record
    deadline = time.monotonic() + EXIT_SETTLE_S
    while record is None and time.monotonic() < deadline:
        time.sleep(EXIT_POLL_S)
        record = read()
    return record


def state_of(attempt: AttemptRecord, runs: Executions | None = None) -> Execution | None:
    """The attempt's execution as Lyceum reports it now (None: its start never got an id)."""
    ex_id = attempt.execution_id
    return (runs or executions()).get(str(ex_id)) if ex_id else None


def abort(attempt: AttemptRecord, runs: Executions | None = None) -> None:
    """Stop the attempt's execution if it still runs (a stalled trainer must not write on)."""
    ex = state_of(attempt, runs)
    if ex is not None and ex.state in ACTIVE:
        (runs or executions()).abort(ex.id)


def logs(attempt: AttemptRecord, runs: Executions | None = None) -> list[str]:
    """The execution's own log lines (the platform's logs API), oldest first."""
    ex_id = attempt.execution_id
    return (runs or executions()).logs(str(ex_id)) if ex_id else []

"""A serverless attempt's execution (glue.runs.serverless) as the monitor, recovery and `glue logs` see it:
its state, its platform log, and its abort. Below the monitor (which reads it), above the Lyceum client."""

from __future__ import annotations

from typing import Any

from glue.cloud.lyceum.api import LyceumClient
from glue.cloud.lyceum.executions import ACTIVE, Execution, Executions


def is_serverless(attempt: dict[str, Any]) -> bool:
    return bool(attempt.get("execution"))


def executions() -> Executions:
    return Executions(LyceumClient.from_env())


def state_of(attempt: dict[str, Any], runs: Executions | None = None) -> Execution | None:
    """The attempt's execution as Lyceum reports it now (None: its start never got an id)."""
    ex_id = (attempt.get("execution") or {}).get("id")
    return (runs or executions()).get(str(ex_id)) if ex_id else None


def abort(attempt: dict[str, Any], runs: Executions | None = None) -> None:
    """Stop the attempt's execution if it still runs (a stalled trainer must not write on)."""
    ex = state_of(attempt, runs)
    if ex is not None and ex.state in ACTIVE:
        (runs or executions()).abort(ex.id)


def logs(attempt: dict[str, Any], runs: Executions | None = None) -> list[str]:
    """The execution's own log lines (the platform's logs API), oldest first."""
    ex_id = (attempt.get("execution") or {}).get("id")
    return (runs or executions()).logs(str(ex_id)) if ex_id else []

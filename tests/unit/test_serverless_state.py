"""A serverless attempt (runtime lyceum-run) as the monitor sees it: its execution is its VM. Every end
state of an execution, with or without the supervisor's exit record, gives the class a user expects."""

from __future__ import annotations

from typing import Any

import pytest

from glue.cloud.lyceum.executions import Execution, state_of
from glue.runs import monitor
from glue.runs.classify import AttemptClass, Evidence, classify

ATTEMPT = {"attempt": 1, "execution": {"id": "ex-1", "type": "gpu.a100"}}


class Store:
    def __init__(self, exit_rec: dict[str, Any] | None) -> None:
        self.exit_rec = exit_rec

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        return self.exit_rec


class Runs:
    """The runs API's answer for one execution (what glue.cloud.lyceum.executions.Executions.get returns)."""

    def __init__(self, status: str) -> None:
        self.status = status

    def get(self, ex_id: str) -> Execution:
        return Execution(ex_id, state_of(self.status))


@pytest.mark.parametrize(("status", "exit_rec", "outcome", "says"), [
    ("running", None, AttemptClass.RUNNING, ""),
    ("pending", None, AttemptClass.RUNNING, ""),
    ("queued", None, AttemptClass.RUNNING, ""),                # an older client's name for pending
    ("completed", {"exit_code": 0, "signal": None}, AttemptClass.COMPLETED, ""),
    ("system_failure", None, AttemptClass.VM_LOST, "execution ex-1 (system_failure)"),
    ("failed_system", None, AttemptClass.VM_LOST, "execution ex-1 (system_failure)"),
    ("failed", None, AttemptClass.VM_LOST, "execution ex-1 (failed)"),    # killed at its cap: no exit record
    ("aborted", None, AttemptClass.VM_LOST, "execution ex-1 (aborted)"),
    ("failed", {"exit_code": 1, "signal": None}, AttemptClass.USER_ERROR, "exit 1"),  # the trainer's own error
    ("failed", {"exit_code": 137, "signal": None, "oom_kills": 1}, AttemptClass.OOM_HOST, "oom_kill"),
])
def test_every_end_of_an_execution_is_classed(monkeypatch: pytest.MonkeyPatch, status: str,
                                              exit_rec: dict[str, Any] | None, outcome: AttemptClass,
                                              says: str) -> None:
    monkeypatch.setattr(monitor.serverless_state, "executions", lambda: Runs(status))
    st = monitor._execution_state(Store(exit_rec), 1, ATTEMPT)  # type: ignore[arg-type]
    ev = Evidence(heartbeat_age_s=1.0, stall_timeout_s=60.0, heartbeat_step=10)
    monitor.combine(ev, [st], [], [], None)
    verdict = classify(ev)
    assert verdict.outcome is outcome and says in verdict.reason, verdict


def test_a_running_execution_whose_heartbeat_stopped_is_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor.serverless_state, "executions", lambda: Runs("running"))
    st = monitor._execution_state(Store(None), 1, ATTEMPT)  # type: ignore[arg-type]
    ev = Evidence(heartbeat_age_s=90.0, stall_timeout_s=60.0, heartbeat_step=10)
    monitor.combine(ev, [st], [], [], None)
    assert classify(ev).outcome is AttemptClass.STALL


def test_an_attempt_whose_start_got_no_id_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    st = monitor._execution_state(Store(None), 1, {"attempt": 1, "execution": {"id": None}})  # type: ignore[arg-type]
    assert st.gone and not st.alive

"""A serverless attempt (runtime lyceum-run) as the monitor sees it: its execution is its VM. Every end
state of an execution, with or without the supervisor's exit record, gives the class a user expects."""

from __future__ import annotations

from typing import Any

import pytest

from glue.cloud.lyceum.executions import Execution, state_of
from glue.runs import monitor, serverless_state
from glue.runs.classify import AttemptClass, Evidence, classify
from glue.runs.records import AttemptRecord

ATTEMPT = AttemptRecord.from_dict({"attempt": 1, "execution": {"id": "ex-1", "type": "gpu.a100"}})


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """An execution that ended without its exit record is judged after a settle (10 s); 0.3 s here."""
    monkeypatch.setattr(serverless_state, "EXIT_SETTLE_S", 0.3)


class Store:
    """The bucket's exit record of the attempt: `late` reads see none before it lands."""

    def __init__(self, exit_rec: dict[str, Any] | None, late: int = 0) -> None:
        self.exit_rec, self.late, self.reads = exit_rec, late, 0

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        self.reads += 1
        return self.exit_rec if self.reads > self.late else None


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
    st = monitor._execution_state(Store(None), 1, AttemptRecord.from_dict({"attempt": 1, "execution": {"id": None}}))  # type: ignore[arg-type]
    assert st.gone and not st.alive


def test_an_exit_record_that_lands_after_the_end_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The execution is reported completed while the exit record its supervisor wrote through the bucket mount
    is not listed yet: the attempt completed, it was not lost (it was classed vm_lost and run again)."""
    monkeypatch.setattr(monitor.serverless_state, "executions", lambda: Runs("completed"))
    store = Store({"exit_code": 0, "signal": None}, late=2)
    st = monitor._execution_state(store, 1, ATTEMPT)  # type: ignore[arg-type]
    ev = Evidence(heartbeat_age_s=1.0, stall_timeout_s=60.0, heartbeat_step=10)
    monitor.combine(ev, [st], [], [], None)
    assert not st.gone and classify(ev).outcome is AttemptClass.COMPLETED and store.reads == 3


@pytest.mark.parametrize("status", ["system_failure", "aborted", "running"])
def test_no_wait_where_no_exit_record_can_come(monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Ended by the platform (its process killed) or still running: the record is read once."""
    monkeypatch.setattr(monitor.serverless_state, "executions", lambda: Runs(status))
    store = Store(None)
    monitor._execution_state(store, 1, ATTEMPT)  # type: ignore[arg-type]
    assert store.reads == 1

"""glue watch's decision table, budgets, backoff, the preempted class, and the notification hooks."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from glue.runs.classify import AttemptClass, Evidence, classify
from glue.runs.config import NotifySpec, RecoverySpec
from glue.train.run.notice import PREEMPTED_EXIT
from glue.watch import notify
from glue.watch.policy import MAX_TRIES, backoff, decide

SPEC = RecoverySpec(max_preemptions=2, max_failures=1, backoff_seconds=10, backoff_max_seconds=25,
                    deadline_hours=1)
NOW = 1_000_000.0


@pytest.mark.parametrize(("outcome", "action", "event", "budget"), [
    (AttemptClass.RUNNING, "none", None, None),
    (AttemptClass.COMPLETED, "done", None, None),
    (AttemptClass.VM_LOST, "recover", None, "preemptions"),
    (AttemptClass.PREEMPTED, "recover", None, "preemptions"),
    (AttemptClass.STALL, "recover", None, "failures"),
    (AttemptClass.COMM, "recover", None, "failures"),
    (AttemptClass.STORAGE_LOST, "recover", None, "failures"),
    (AttemptClass.KILLED, "recover", None, "failures"),
    (AttemptClass.OOM_GPU, "stop", "oom", None),
    (AttemptClass.OOM_HOST, "stop", "oom", None),
    (AttemptClass.BAD_RESTART, "stop", "bad_restart", None),
    (AttemptClass.USER_ERROR, "stop", "failed", None),
    (AttemptClass.EXPORT_MISSING, "stop", "failed", None),
])
def test_decision_table(outcome: AttemptClass, action: str, event: str | None, budget: str | None) -> None:
    d = decide(outcome, SPEC, {}, NOW, 0.0, NOW - 60)
    assert (d.action, d.event, d.budget) == (action, event, budget)


def test_budgets_are_separate_and_exhaustion_stops() -> None:
    used = {"preemptions": 1, "failures": 1}
    assert decide(AttemptClass.VM_LOST, SPEC, used, NOW, 0.0, NOW).action == "recover"  # 1 of 2 used
    d = decide(AttemptClass.STALL, SPEC, used, NOW, 0.0, NOW)  # the failure budget (1) is spent
    assert d.action == "stop" and d.event == "budget_exhausted" and "failures budget is used up (1/1)" in d.reason
    used["preemptions"] = 2
    assert decide(AttemptClass.PREEMPTED, SPEC, used, NOW, 0.0, NOW).event == "budget_exhausted"


def test_backoff_doubles_to_the_cap_retries_do_not_spend_budget_and_deadline_stops() -> None:
    assert [backoff(SPEC, k) for k in range(5)] == [0, 10, 20, 25, 25]
    assert decide(AttemptClass.VM_LOST, SPEC, {}, NOW, NOW + 5, NOW).action == "wait"
    spent = {"preemptions": 2}  # the budget is used up, but this failure's own retries go on (backing off)
    assert decide(AttemptClass.VM_LOST, SPEC, spent, NOW, NOW + 5, NOW, retry=1).action == "wait"
    assert decide(AttemptClass.VM_LOST, SPEC, spent, NOW, NOW - 1, NOW, retry=1).action == "recover"
    gave_up = decide(AttemptClass.VM_LOST, SPEC, spent, NOW, 0.0, NOW, retry=MAX_TRIES)
    assert gave_up.action == "stop" and gave_up.event == "recovery_failed"
    late = decide(AttemptClass.VM_LOST, SPEC, {}, NOW, 0.0, NOW - 3601)
    assert late.action == "stop" and late.event == "budget_exhausted" and "deadline" in late.reason


def test_waiting_for_capacity_spends_no_budget_and_no_try_but_the_deadline_holds() -> None:
    spent = {"preemptions": 2}  # this failure took the last of its budget, then found no capacity 5 times
    assert decide(AttemptClass.VM_LOST, SPEC, spent, NOW, NOW + 5, NOW, capacity_waits=5).action == "wait"
    again = decide(AttemptClass.VM_LOST, SPEC, spent, NOW, NOW - 1, NOW, capacity_waits=MAX_TRIES + 5)
    assert again.action == "recover" and "no capacity" in again.reason
    late = decide(AttemptClass.VM_LOST, SPEC, spent, NOW, NOW - 1, NOW - 3601, capacity_waits=5)
    assert late.action == "stop" and "deadline" in late.reason
    # A new failure after the capacity wait (capacity_waits 0 for it) takes from the budget as ever.
    assert decide(AttemptClass.VM_LOST, SPEC, spent, NOW, 0.0, NOW).event == "budget_exhausted"


def test_a_notice_makes_the_loss_preempted_not_a_crash() -> None:
    notice = {"source": "SIGTERM", "step": 42, "saved_step": 42}
    v = classify(Evidence(exit_code=PREEMPTED_EXIT, notice=notice, process_alive=False, vm_status="running",
                          ssh_reachable=True))
    assert v.outcome is AttemptClass.PREEMPTED and "checkpoint 42 saved" in v.reason
    gone = classify(Evidence(vm_status="gone", notice={**notice, "saved_step": None}, process_alive=False))
    assert gone.outcome is AttemptClass.PREEMPTED
    # Without the notice record the same exit is the trainer's own failure; a live trainer is running.
    assert classify(Evidence(exit_code=PREEMPTED_EXIT, process_alive=False)).outcome is AttemptClass.USER_ERROR
    assert classify(Evidence(notice=notice, process_alive=True, heartbeat_age_s=1)).outcome is AttemptClass.RUNNING


def test_a_save_before_the_execution_cap_is_capped_and_continues_from_no_budget() -> None:
    """Chaining serverless executions is the plan, not a failure: a stop-at notice with its checkpoint saved
    is `capped`, and the watcher continues it whatever the budgets and the deadline say."""
    notice = {"source": "stop-at deadline 1700000000 (GPUKIT_STOP_AT: the execution's cap is near)", "step": 40,
              "saved_step": 40}
    v = classify(Evidence(exit_code=PREEMPTED_EXIT, notice=notice, process_alive=False, vm_status="running"))
    assert v.outcome is AttemptClass.CAPPED and "saved step 40" in v.reason
    # Not saved (the cap came first): the loss it is, from the checkpoint before.
    unsaved = classify(Evidence(vm_status="gone", notice={**notice, "saved_step": None}, process_alive=False))
    assert unsaved.outcome is AttemptClass.PREEMPTED
    spent = {"preemptions": 2, "failures": 1}
    d = decide(AttemptClass.CAPPED, SPEC, spent, NOW, 0.0, NOW - 7200)
    assert (d.action, d.budget) == ("recover", None) and "no budget" in d.reason
    assert decide(AttemptClass.CAPPED, SPEC, spent, NOW, NOW + 5, NOW, retry=1).action == "wait"
    gave_up = decide(AttemptClass.CAPPED, SPEC, spent, NOW, 0.0, NOW, retry=MAX_TRIES)
    assert gave_up.action == "stop" and gave_up.event == "recovery_failed"


class _Receiver(BaseHTTPRequestHandler):
    got: list[dict[str, Any]] = []
    fail_first = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
        else:
            type(self).got.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)  # loopback only
    _Receiver.got, _Receiver.fail_first = [], 1
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook?token=s3cret"
    server.shutdown()


def _closed_port() -> int:
    """A loopback port nothing listens on: a connection is refused at once (a fixed one such as 9 may be
    filtered on a CI host, where each try waits out its timeout)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_notify_command_and_webhook(receiver: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same retry rules (connection errors and 5xx retried), without the backoff and long timeouts.
    monkeypatch.setattr(notify, "WEBHOOK_RETRY", notify.WEBHOOK_RETRY.new(backoff_factor=0))
    monkeypatch.setattr(notify, "WEBHOOK_TIMEOUT_S", 2.0)
    out = tmp_path / "events.jsonl"
    cmd = (sys.executable, "-c", f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')")
    monkeypatch.setenv("TEAM_HOOK", receiver)
    spec = NotifySpec(command=cmd, webhook_env="TEAM_HOOK", events=("oom", "recovered"))
    event = {"event": "oom", "run": "r1", "attempt": 2, "class": "oom_host"}
    assert notify.send(spec, event) == {"command": "ok", "webhook": "ok"}  # the webhook's first 503 is retried
    assert json.loads(out.read_text()) == event and _Receiver.got == [event]
    assert notify.send(spec, {**event, "event": "failed"}) == {}  # not subscribed
    monkeypatch.delenv("TEAM_HOOK")
    res = notify.send(NotifySpec(webhook=f"http://127.0.0.1:{_closed_port()}/x?token=s3cret"), event)
    assert "did not answer" in res["webhook"] and "s3cret" not in res["webhook"]  # the URL is never echoed
    assert "not set" in notify.send(NotifySpec(webhook_env="TEAM_HOOK"), event)["webhook"]

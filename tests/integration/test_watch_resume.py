"""A watcher that died mid-recovery after the new attempt started: the next watcher checks that resume as
`glue recover` would have (glue.operations.recovery.resume_check), records the verdict, and stops a wrong one as a
bad restart with an incident and a notification. Real bucket (rclone), records as the trainer and
recover write them; no VMs (the monitor's check and the kill of the bad attempt are stood in for)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from glue.operations.recovery.resume_plan import ResumePlan
from glue.paths import PROJECT_ROOT
from glue.runs.classify import AttemptClass, Diagnosis, Evidence
from glue.runs.monitor import Report
from glue.runs.store import RunStore, utc_iso
from glue.train import layout
from glue.watch import controller, outbox
from glue.watch.controller import Watcher
from glue.watch.outbox import STALE_S
from glue.watch.watch_state import WatchState
from tests.conftest import BucketHandle

pytestmark = pytest.mark.integration

CKPT, FAILED_AT, UPTO = 20, 30, 30


def _loss(step: int) -> float:
    return round(5.0 / (1 + step), 6)


def _metrics(store: RunStore, attempt: int, steps: range, bad_at: int | None = None) -> None:
    lines = [json.dumps({"attempt": attempt, "rank": 0, "step": s, "t": utc_iso(),
                         "loss": _loss(s) + (0.5 if s == bad_at else 0.0)}) for s in steps]
    store.put_bytes(layout.metrics_key(attempt, 0, 0, steps.start), "\n".join(lines).encode())


def _run(local_bucket: BucketHandle, tmp_path: Path, run: str, new_steps: range,
         bad_at: int | None = None) -> tuple[RunStore, Watcher, Path]:
    raw = yaml.safe_load((PROJECT_ROOT / "examples" / "tiny_gpt.yaml").read_text())
    events = tmp_path / f"{run}-events.jsonl"
    raw["notify"] = {"command": [sys.executable, "-c",
                                 f"import sys; open({str(events)!r}, 'a').write(sys.stdin.read() + '\\n')"],
                     "events": ["recovered", "bad_restart"]}
    store = RunStore(local_bucket.info, local_bucket.creds, run)
    target = layout.run_uri(local_bucket.info.name, run)
    store.put_manifest({"run": run, "config": raw, "checkpoint": {"target": target},
                                     "created_at": utc_iso(), "environment": {}})
    store.put_json(layout.attempt_key(1), {"run": run, "attempt": 1, "vm": "gpukit-1", "vm_id": "gpukit-1-aaaa",
                                       "backend": "local", "failure_class": "vm_lost", "started_at": utc_iso()})
    store.put_json(layout.attempt_key(2), {"run": run, "attempt": 2, "vm": "gpukit-1", "vm_id": "gpukit-1-bbbb",
                                       "backend": "local", "resume": True, "started_at": utc_iso(),
                                       "nodes": [{"node": 0, "vm": "gpukit-1", "vm_id": "gpukit-1-bbbb"}]})
    _metrics(store, 1, range(1, FAILED_AT + 1))
    _metrics(store, 2, new_steps, bad_at)
    # What the dead watcher left: the recovery counted and under way, the new attempt's plan recorded.
    st = WatchState(run, used={"preemptions": 1, "failures": 0}, handled_attempt=1, adopted_attempt=1)
    st.note("recovering", attempt=1, outcome="vm_lost", budget="preemptions")
    st.resume_plan = ResumePlan(failed_attempt=1, new_attempt=2, failure_class="vm_lost", checkpoint_step=CKPT,
                                failure_step=FAILED_AT, upto=UPTO, started_at=utc_iso(),
                                seconds={"detect": 1.2, "provision": 3.0})
    st.save(store)
    watcher = Watcher(tmp_path, (run,), Console(file=io.StringIO()), stores={run: store})
    return store, watcher, events


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    killed: list[int] = []

    def check(home: Path, store: RunStore, record_incident: bool = True,
              unreachable: frozenset[str] = frozenset()) -> Report:
        att = store.latest_attempt()
        assert att is not None
        verdict = Diagnosis(AttemptClass(att.failure_class), str(att.reason)) if att.failure_class \
            else Diagnosis(AttemptClass.RUNNING, "heartbeat fresh")
        return Report(attempt=att, evidence=Evidence(), diagnosis=verdict, heartbeat=None)

    monkeypatch.setattr(controller.monitor, "check", check)
    monkeypatch.setattr(controller.phases, "kill_attempt",
                        lambda home, store, attempt, freeze=None: killed.append(attempt.attempt))
    return killed


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_interrupted_recovery_is_verified_when_the_new_attempt_gets_there(local_bucket: BucketHandle,
                                                                          tmp_path: Path, stand_ins: list[int]) -> None:
    store, watcher, events = _run(local_bucket, tmp_path, "w-int-ok", range(CKPT + 1, 26))
    row = watcher.watch_run("w-int-ok")  # attempt 2 is at step 25: not far enough to compare up to 30
    assert "checking attempt 2's resume at step 30 (now 25)" in row.note, row
    st = WatchState.load(store)
    assert st is not None and st.resume_plan is not None and [h["action"] for h in st.history] == \
        ["recovering", "recovery_interrupted"]
    assert store.get_json(layout.recovery_key(1)) is None
    _metrics(store, 2, range(26, 36))
    row = watcher.watch_run("w-int-ok")
    rec = store.get_json(layout.recovery_key(1))
    assert rec["verified"] and rec["interrupted"] and rec["first_resumed_step"] == CKPT + 1, rec
    assert rec["compared_steps"] == list(range(CKPT + 1, UPTO + 1)) and rec["seconds"]["detect"] == 1.2
    st = WatchState.load(store)
    assert st is not None and st.resume_plan is None and not st.stopped and st.used == {"preemptions": 1,
                                                                                        "failures": 0}
    assert [h["action"] for h in st.history][-3:] == ["recovery_interrupted", "recovered", "notified"]
    assert [e["event"] for e in _events(events)] == ["recovered"] and row.state == "running"
    assert stand_ins == []
    watcher.watch_run("w-int-ok")  # checked once
    assert store.get_json(layout.recovery_key(2)) is None and len(_events(events)) == 1


def test_interrupted_recovery_with_a_wrong_resume_is_a_bad_restart(local_bucket: BucketHandle, tmp_path: Path,
                                                                   stand_ins: list[int]) -> None:
    store, watcher, events = _run(local_bucket, tmp_path, "w-int-bad", range(CKPT + 1, 36), bad_at=27)
    row = watcher.watch_run("w-int-bad")
    rec = store.get_json(layout.recovery_key(1))
    assert not rec["verified"] and "loss at step 27" in rec["problem"], rec
    att = store.attempt(2)
    assert att["failure_class"] == "bad_restart" and stand_ins == [2]  # the wrong attempt was stopped
    incident = store.get_json(att["incident"])
    assert incident["class"] == "bad_restart" and "loss at step 27" in incident["reason"]
    st = WatchState.load(store)
    assert st is not None and st.stopped and "bad_restart" in st.stopped and row.state == "stopped"
    assert [e["event"] for e in _events(events)] == ["bad_restart"]
    assert _events(events)[0]["incident"] == att["incident"]
    watcher.watch_run("w-int-bad")  # stopped: nothing more
    assert len(_events(events)) == 1 and store.attempts() == [1, 2]


class Killed(BaseException):
    """The watcher's process dies here (as under SIGKILL: nothing after it runs)."""


def test_a_notice_whose_watcher_died_before_sending_it_is_sent_by_the_next_watcher(
        local_bucket: BucketHandle, tmp_path: Path, stand_ins: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    store, watcher, events = _run(local_bucket, tmp_path, "w-outbox", range(CKPT + 1, 36))

    def dies(spec: Any, event: dict[str, Any]) -> dict[str, str]:
        raise Killed

    send = outbox.notify.send
    monkeypatch.setattr(outbox.notify, "send", dies)
    with pytest.raises(Killed):  # it recorded the verified recovery, then died before the hook ran
        watcher.watch_run("w-outbox")
    st = WatchState.load(store)
    assert st is not None and st.history[-1]["action"] == "recovered" and _events(events) == []
    [owed] = st.outbox  # saved in the same write as the recovery it announces
    assert owed["event"]["event"] == "recovered" and owed["event"]["attempt"] == 1
    monkeypatch.setattr(outbox.notify, "send", send)
    # Another watcher, at once: the notice may still be being sent by its watcher (a send takes up to STALE_S).
    later = Watcher(tmp_path, ("w-outbox",), Console(file=io.StringIO()), stores={"w-outbox": store})
    later.watch_run("w-outbox")
    assert _events(events) == [] and len((WatchState.load(store) or st).outbox) == 1
    # Past STALE_S its watcher is surely gone: the next watcher sends it, once, and takes it out.
    monkeypatch.setattr(outbox, "STALE_S", 0.0)
    later.watch_run("w-outbox")
    later.watch_run("w-outbox")
    sent = _events(events)
    assert [(e["event"], e["run"], e["recovery"]["verified"]) for e in sent] == [("recovered", "w-outbox", True)]
    st = WatchState.load(store)
    assert st is not None and st.outbox == [] and st.history[-1]["action"] == "notified", st.history[-3:]
    assert outbox.STALE_S == 0.0 and 200 < STALE_S  # longer than the command's timeout and the webhook's tries

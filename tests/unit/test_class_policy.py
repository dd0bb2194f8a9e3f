"""One ClassPolicy per attempt class, and the rules `glue recover`, `glue advise` and `glue watch` derive
from it are the ones they had as separate tables (spelled out here, so a change to the table shows)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from glue.errors import GlueError
from glue.operations.recovery import advise, phases
from glue.runs.class_policy import POLICIES, AttemptClass, ClassPolicy, policy_of
from glue.runs.classify import Diagnosis
from glue.runs.config import RecoverySpec
from glue.watch.policy import decide

FAILURES = [c for c in AttemptClass if c.is_failure]


def test_every_class_has_exactly_one_policy() -> None:
    # A dict holds one value per key; what this guards is a new enum member with no row at all.
    missing = [c for c in AttemptClass if c not in POLICIES]
    assert missing == [], f"add a ClassPolicy for {missing} in glue/runs/class_policy.py"
    assert set(POLICIES) == set(AttemptClass)
    assert all(isinstance(policy_of(c), ClassPolicy) for c in FAILURES)


def test_every_failure_has_a_policy_text_and_exactly_one_watch_handling() -> None:
    for c in FAILURES:
        p = policy_of(c)
        assert p.text, c
        handled = [p.budget is not None, p.stop_event is not None, p.watch == "continue"]
        assert handled.count(True) == 1, c
    assert policy_of(AttemptClass.RUNNING).text == "" and policy_of(AttemptClass.COMPLETED).text == ""


def test_a_refusal_is_either_forceable_or_not() -> None:
    for c, p in POLICIES.items():
        assert p.refuse_always is None or p.refuse_without_force is None, c
        assert not (p.recoverable and (p.refuse_always or p.refuse_without_force)), c


def test_keepable_classes() -> None:
    assert {c for c, p in POLICIES.items() if p.keepable} == {
        AttemptClass.STALL, AttemptClass.COMM, AttemptClass.USER_ERROR, AttemptClass.KILLED,
        AttemptClass.STORAGE_LOST}


def test_advise_counts_the_recoverable_failures() -> None:
    assert advise.RECOVERABLE == {"vm_lost", "preempted", "stall", "comm", "killed", "storage_lost"}
    assert all(isinstance(c, str) for c in advise.RECOVERABLE)


def test_watcher_budgets_and_stop_events() -> None:
    budgets = {c: p.budget for c, p in POLICIES.items() if p.budget is not None}
    assert budgets == {
        AttemptClass.VM_LOST: "preemptions", AttemptClass.PREEMPTED: "preemptions",
        AttemptClass.STALL: "failures", AttemptClass.COMM: "failures", AttemptClass.STORAGE_LOST: "failures",
        AttemptClass.KILLED: "failures"}
    events = {c: p.stop_event for c, p in POLICIES.items() if p.stop_event is not None}
    assert events == {
        AttemptClass.OOM_GPU: "oom", AttemptClass.OOM_HOST: "oom", AttemptClass.BAD_RESTART: "bad_restart",
        AttemptClass.USER_ERROR: "failed", AttemptClass.EXPORT_MISSING: "failed"}
    assert [c for c, p in POLICIES.items() if p.watch == "continue"] == [AttemptClass.CAPPED]


@pytest.mark.parametrize("outcome", list(AttemptClass))
def test_watch_decides_from_the_policy(outcome: AttemptClass) -> None:
    d = decide(outcome, RecoverySpec(), {}, now=100.0, next_try_at=0.0, started_at=None)
    p = policy_of(outcome)
    expected_action = {"none": "none", "done": "done"}.get(p.watch, "stop" if p.stop_event else "recover")
    assert d.action == expected_action
    assert d.event == p.stop_event and d.budget == p.budget


TINY_GPT = {"command": ["python", "-m", "glue.examples.tiny_gpt"], "config": {"batch_size": 8}}


def _detect(monkeypatch: pytest.MonkeyPatch, outcome: AttemptClass, reason: str, force: bool,
            run_config: dict[str, object] = TINY_GPT) -> str:
    report = SimpleNamespace(diagnosis=Diagnosis(outcome, reason))
    monkeypatch.setattr(phases.monitor, "check", lambda home, store: report)
    store = SimpleNamespace(run="r7", read_manifest=lambda: SimpleNamespace(config=run_config))
    with pytest.raises(GlueError) as err:
        phases.detect(Path("/nonexistent"), store, force)
    return str(err.value)


@pytest.mark.parametrize(("run_config", "says"), [
    ({"command": ["python", "train.py"], "config": {"per_device_train_batch_size": 16}},
     "investigate with `glue memprobe --run r7 --vary per_device_train_batch_size` and change the input"),
    ({"command": ["python", "train.py"], "runtime": "docker", "config": {"batch_size": 16}},
     "investigate with a probe of your own (`glue memprobe` runs trials of `runtime: process` runs only"),
])
def test_an_oom_refusal_names_a_memprobe_command_that_works_for_the_run(
        monkeypatch: pytest.MonkeyPatch, run_config: dict[str, object], says: str) -> None:
    assert says in _detect(monkeypatch, AttemptClass.OOM_HOST, "why", False, run_config)


OOM_REFUSAL = ("restarting does not repair a repeatable memory failure; investigate with "
               "`glue memprobe --run r7` and change the input, or pass --force")


@pytest.mark.parametrize(("outcome", "message"), [
    (AttemptClass.OOM_GPU, "run r7 failed with oom_gpu: " + OOM_REFUSAL),
    (AttemptClass.OOM_HOST, "run r7 failed with oom_host: " + OOM_REFUSAL),
    (AttemptClass.BAD_RESTART, "run r7 failed with bad_restart: the last resume was wrong; fix the trainer "
                               "(see `glue incidents --run r7`), or pass --force"),
    (AttemptClass.USER_ERROR, "run r7 failed with user_error: the trainer failed with an error of its own "
                              "(see `glue incidents --run r7`); fix it, or pass --force"),
])
def test_recover_refuses_without_force(monkeypatch: pytest.MonkeyPatch, outcome: AttemptClass, message: str) -> None:
    assert _detect(monkeypatch, outcome, "why", force=False) == message
    assert {c for c, p in POLICIES.items() if p.refuse_without_force} == {
        AttemptClass.OOM_GPU, AttemptClass.OOM_HOST, AttemptClass.BAD_RESTART, AttemptClass.USER_ERROR}


@pytest.mark.parametrize(("outcome", "reason", "message"), [
    (AttemptClass.RUNNING, "heartbeat step 3, 1s ago",
     "run r7 is healthy (heartbeat step 3, 1s ago); nothing to recover"),
    (AttemptClass.COMPLETED, "exit 0", "run r7 completed; nothing to recover"),
    (AttemptClass.EXPORT_MISSING, "finished, but required outputs are missing from the bucket: a.bin, b.bin",
     "run r7 finished, but required outputs are missing from the bucket (a.bin, b.bin); a restart does not fix "
     "that: export them"),
])
def test_recover_refuses_even_with_force(monkeypatch: pytest.MonkeyPatch, outcome: AttemptClass, reason: str,
                                         message: str) -> None:
    assert _detect(monkeypatch, outcome, reason, force=True) == message


def test_policy_text_reaches_the_diagnosis() -> None:
    assert Diagnosis(AttemptClass.OOM_GPU, "x").policy == \
        "no blind restart: it repeats at this input; investigate with `glue memprobe`"
    assert Diagnosis(AttemptClass.STORAGE_LOST, "x").policy == \
        "infrastructure, not the trainer: `glue recover` resumes it on a VM with a live bucket mount"
    assert Diagnosis(AttemptClass.RUNNING, "x").policy == ""

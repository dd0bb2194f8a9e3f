"""`runtime: lyceum-run` through the real CLI against the emulator's runs API: each attempt is one
serverless execution (a real process with the bucket at /mnt/s3) running gpukit's trainer library from
the "image". An execution the platform loses midway is classed, resubmitted by `glue watch` from the
newest valid checkpoint and the resume verified; a run longer than the execution cap saves before each
cap and is chained across executions (from no budget), with per-step losses equal to an unchained run."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glue.runs.store import RunStore
from glue.train import layout
from tests.lyceum_emulator import Emulator

from .conftest import Kit
from .test_lyceum_e2e import lyceum_env
from .test_runs import run_config

pytestmark = pytest.mark.integration
IMAGE = "ghcr.io/example/gpukit-trainer:1"


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.1, boot_vms=False) as emulator:
        yield emulator


@pytest.fixture
def env(kit: Kit, emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = lyceum_env(kit, emu)
    for key, value in env.items():  # this process reads the run's records from Lyceum's bucket too
        monkeypatch.setenv(key, value)
    return env


def _config(tmp_path: Path, name: str, steps: int, checkpoint: dict[str, Any] | None = None,
            secrets: list[str] | None = None, eval_every: int = 0, evaluation: dict[str, Any] | None = None,
            **execution: Any) -> Path:
    extra = {"evaluation": evaluation} if evaluation else {}
    return run_config(tmp_path, name=name, runtime="lyceum-run", image=IMAGE,
                      command=["python3", "-m", "glue.examples.tiny_gpt"], secrets=secrets or [], **extra,
                      config={"steps": steps, "step_sleep": 0.2, "checkpoint_interval": 10, "eval_every": eval_every},
                      checkpoint={"interval_steps": 10, **(checkpoint or {})},
                      execution={"type": "gpu.a100", **execution})


def _status(kit: Kit, env: dict[str, str], run: str) -> dict[str, Any]:
    return dict(json.loads(kit.glue("status", "--run", run, "--json", env=env).stdout))


def _until_completed(kit: Kit, env: dict[str, str], run: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while (st := _status(kit, env, run))["state"] != "completed":
        assert time.monotonic() < deadline and st["state"] in ("running", "completed"), st
        time.sleep(1)


def _losses(store: RunStore) -> dict[int, float]:
    """Step -> loss over every attempt in order (a resumed attempt's replayed steps replace the lost ones')."""
    out: dict[int, float] = {}
    for _, steps in sorted(store.metrics().items()):
        out.update({step: rec["loss"] for step, rec in steps.items()})
    return out


# `stress` (make test-all): make test resubmits a serverless run from its newest checkpoint in the chained run
# below (resume equal to the unchained run), and classes every end of an execution
# (tests/unit/test_serverless_state.py).
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_a_lost_execution_is_resubmitted_by_watch_and_the_resume_verified(
        kit: Kit, emu: Emulator, env: dict[str, str], tmp_path: Path) -> None:
    data = ("the model saves the weights before dawn.\n" * 40).encode()
    pin = hashlib.sha256(data).hexdigest()
    cfg = _config(tmp_path, "sl.yaml", 60, secrets=["HF_TOKEN"], eval_every=20,
                  evaluation={"dataset": {"uri": "s3://{bucket}/eval/sl.txt", "sha256": pin},
                              "metrics": {"val_loss": {"max": 10.0}}})
    # Bad input first: one line each, nothing submitted. (The first one also makes this kit home a Lyceum one.)
    off_bucket = _config(tmp_path, "off.yaml", 60, checkpoint={"target": "/scratch/ckpt"})
    for n, (path, says) in enumerate([(off_bucket, "is not in the bucket: an execution's own disk is gone"),
                                      (cfg, "secret HF_TOKEN is not set in this shell")]):
        if n == 1:  # the pinned evaluation set, in Lyceum's bucket
            bucket = RunStore.open(kit.home, "sl")
            bucket.s3.put_object(Bucket=bucket.info.name, Key="eval/sl.txt", Body=data)
        bad = kit.glue("deploy", "--run", "bad", "--config", str(path), env=env, check=False)
        assert bad.returncode != 0 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert emu.executions.runs == {}

    env = {**env, "HF_TOKEN": "hf_s3cr3t_value"}  # the watcher below resubmits with it too
    out = kit.glue("deploy", "--run", "sl", "--config", str(cfg), env=env)
    said = " ".join(out.stderr.split())
    assert "attempt 1 submitted as Lyceum execution" in said, said
    store = RunStore.open(kit.home, "sl")
    first = store.attempt(1)["execution"]
    assert store.manifest()["runtime"] == "lyceum-run" and first["type"] == "gpu.a100"
    launch = store.get_json(layout.launch_key(1))
    assert launch["env"]["GPUKIT_BUCKET_VIA"] == "mount" and "GPUKIT_STOP_AT" in launch["env"]
    # The secret reaches the container by name through the execution's environment, never the bucket.
    assert emu.executions.runs[first["id"]].env["HF_TOKEN"] == "hf_s3cr3t_value"
    assert "hf_s3cr3t_value" not in json.dumps(launch) and "hf_s3cr3t_value" not in json.dumps(store.manifest())
    deadline = time.monotonic() + 180
    while (_status(kit, env, "sl").get("step") or 0) < 25:
        assert time.monotonic() < deadline, _status(kit, env, "sl")
        time.sleep(0.5)

    emu.executions.fail(first["id"])  # the platform loses the machine under the run: system_failure
    out = kit.glue("watch", "--once", "--run", "sl", env=env, timeout=600)
    said = " ".join((out.stdout + out.stderr).split())
    assert "vm_lost" in said and "recovered onto attempt 2 (verified)" in said, said
    incident = [i for i in json.loads(kit.glue("incidents", "--run", "sl", "--json", env=env).stdout)
                if i.get("attempt") == 1]
    assert incident and "system_failure" in incident[0]["reason"], incident
    rec = store.get_json(layout.recovery_key(1))
    assert rec["verified"] and rec["first_resumed_step"] == rec["checkpoint_step"] + 1, rec
    assert rec["new_vm"]["id"] == store.attempt(2)["execution"]["id"] != first["id"]
    _until_completed(kit, env, "sl")
    assert emu.executions.runs[store.attempt(2)["execution"]["id"]].status == "completed"
    # Judged on the pinned evaluation set, read through the execution's mount and checked against its pin.
    verdict = _status(kit, env, "sl")["verdict"]
    assert verdict["accepted"] and verdict["evaluation"]["dataset"]["sha256"] == pin, verdict
    # The platform's own log of the execution: what the trainer printed.
    logs = kit.glue("logs", "--run", "sl", "--attempt", "2", "--platform", env=env).stdout
    assert "step" in logs, logs
    said = " ".join(kit.glue("report", "--run", "sl", env=env).stderr.split())  # a serverless run is reported too
    assert "report:" in said, said


@pytest.mark.timeout(900)
def test_a_run_longer_than_the_cap_is_chained_and_equals_the_unchained_run(
        kit: Kit, emu: Emulator, env: dict[str, str], tmp_path: Path) -> None:
    steps = 150  # 30 s of steps (0.2 s each), more than one execution's share
    kit.glue("deploy", "--run", "whole", "--config", str(_config(tmp_path, "whole.yaml", steps)), env=env)
    # Each execution may run 60 s (the emulator's unit is one second) and is told to save and stop 30 s before
    # that. The steps alone take 30 s and every execution pays the trainer's start (python, torch) again, so the
    # run spans two or more whatever the machine's speed; and 30 s leaves a loaded machine time to save and exit
    # before the cap kills the execution. Every attempt but the last must end capped: a completed one read as
    # lost (its exit record listed after the execution's end) was run again (serverless_state.settled_exit).
    capped = _config(tmp_path, "capped.yaml", steps, timeout=60, timeout_unit_seconds=1, save_margin_seconds=30)
    kit.glue("deploy", "--run", "chained", "--config", str(capped), env=env)
    kit.glue("watch", "--run", "chained", "--interval", "1", env=env, timeout=600)
    _until_completed(kit, env, "whole")
    _until_completed(kit, env, "chained", timeout=60)

    chained, whole = RunStore.open(kit.home, "chained"), RunStore.open(kit.home, "whole")
    attempts = [chained.attempt(n) for n in chained.attempts()]
    assert len(attempts) >= 2, attempts
    assert all(a.get("failure_class") == "capped" for a in attempts[:-1]), \
        [{k: a.get(k) for k in ("attempt", "failure_class", "reason", "outcome", "exit_code", "ended_at")}
         for a in attempts] + [chained.exit_record(n) for n in chained.attempts()]
    assert attempts[-1].get("outcome") == "completed"
    state = chained.get_json(layout.WATCH_STATE)
    assert state["used"].get("preemptions", 0) == 0 and state["used"].get("failures", 0) == 0, state
    for n in chained.attempts()[1:]:  # every continuation was verified
        assert any(r["new_attempt"] == n and r["verified"] for r in chained.recoveries()), chained.recoveries()
    reference = _losses(whole)
    assert sorted(reference) == list(range(1, steps + 1))
    assert _losses(chained) == reference


@pytest.mark.stress  # make test-all: `glue stop` of a VM run is in make test (tests/integration/test_runs.py)
@pytest.mark.timeout(600)
def test_stop_aborts_the_execution_and_the_watcher_leaves_it_until_a_resume(
        kit: Kit, emu: Emulator, env: dict[str, str], tmp_path: Path) -> None:
    cfg = _config(tmp_path, "st.yaml", 400)
    kit.glue("deploy", "--run", "st", "--config", str(cfg), env=env)
    store = RunStore.open(kit.home, "st")
    deadline = time.monotonic() + 120
    while (_status(kit, env, "st").get("step") or 0) < 12:
        assert time.monotonic() < deadline, _status(kit, env, "st")
        time.sleep(0.5)
    said = " ".join(kit.glue("stop", "--run", "st", env=env).stderr.split())
    ex_id = store.attempt(1)["execution"]["id"]
    assert f"attempt 1 stopped, Lyceum execution {ex_id} aborted" in said, said
    assert emu.executions.runs[ex_id].status == "aborted"
    st = _status(kit, env, "st")
    assert st["state"] == "killed" and "stopped on request" in st["reason"] and st["execution"] == ex_id, st
    kit.glue("watch", "--once", "--run", "st", env=env)
    assert store.attempts() == [1]  # the watcher does not recover a run stopped on request
    # `glue recover` continues it in a new execution from the newest valid checkpoint, verified.
    said = " ".join(kit.glue("recover", "--run", "st", env=env, timeout=300).stderr.split())
    assert "resume verified" in said, said
    assert store.attempts() == [1, 2] and store.attempt(2)["execution"]["id"] != ex_id
    # So does a resume (a deploy refuses one beside a live execution).
    again = kit.glue("deploy", "--run", "st", "--config", str(cfg), "--resume", env=env, check=False)
    assert again.returncode != 0 and "is still running" in again.stderr, again.stderr
    kit.glue("stop", "--run", "st", env=env)
    kit.glue("deploy", "--run", "st", "--config", str(cfg), "--resume", env=env)
    assert store.attempts() == [1, 2, 3] and store.attempt(3)["resume"] is True
    kit.glue("stop", "--run", "st", env=env)

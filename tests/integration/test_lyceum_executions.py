"""Lyceum's serverless runs through glue's client (glue/cloud/lyceum/executions.py), against the emulator's
runs API: a real process with the account's bucket at /mnt/s3, its logs, abort, an infrastructure loss,
the execution cap, and secrets that reach the container but no log or error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.bucket_access import BucketInfo
from glue.cloud.lyceum.api import LyceumClient
from glue.cloud.lyceum.backend import LyceumBackend
from glue.cloud.lyceum.executions import Execution, Executions, Submission, state_of
from glue.errors import GlueError
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.lyceum_emulator import Emulator

pytestmark = pytest.mark.integration
PY = "python3"


@pytest.fixture
def emu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.1, boot_vms=False) as emulator:
        for key, value in emulator.env().items():
            monkeypatch.setenv(key, value)
        yield emulator


def _until_ended(runs: Executions, ex_id: str, timeout: float = 60) -> Execution:
    deadline = time.monotonic() + timeout
    while True:
        ex = runs.get(ex_id)
        if ex.ended or time.monotonic() > deadline:
            return ex
        time.sleep(0.1)


def _until_state(runs: Executions, ex_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while runs.get(ex_id).state != state:
        assert time.monotonic() < deadline, runs.get(ex_id)
        time.sleep(0.1)


def test_an_execution_runs_with_the_bucket_at_mnt_s3_and_its_logs_and_secret(emu: Emulator, tmp_path: Path) -> None:
    runs = Executions(LyceumClient.from_env())
    seen, out = layout.run_prefix("ex0") + "seen.txt", layout.run_prefix("ex1") + "out.txt"
    script = (f"import os, pathlib; p = pathlib.Path('/mnt/s3/{layout.RUNS_PREFIX}ex1'); "
              "p.mkdir(parents=True, exist_ok=True); "
              "(p / 'out.txt').write_text(os.environ['GREETING'] + ' ' + str(len(os.environ['HF_TOKEN']))); "
              "print('hello from the run', flush=True)")
    sub = Submission(image="ghcr.io/example/trainer:1", command=[PY, "-c", script], env={"GREETING": "hi"},
                     secrets=("HF_TOKEN",), execution_type="gpu.a100", timeout=120)
    creds = LyceumBackend(tmp_path / "kit").bucket_credentials()
    s3 = bucket_store.client(BucketInfo(emu.sts.endpoint, "gpukit", "us-east-1"), creds)
    s3.put_object(Bucket="gpukit", Key=seen, Body=b"x")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="gpukit", Prefix=layout.RUNS_PREFIX)["Contents"]] == [seen]
    ex = runs.start(sub, {"HF_TOKEN": "hf_s3cr3t_value"})
    assert ex.state == "pending" and ex.id
    done = _until_ended(runs, ex.id)
    assert done.state == "completed", (done, runs.logs(ex.id))
    assert "hello from the run" in runs.logs(ex.id)
    # What the run wrote at /mnt/s3 is in the account's bucket, listed (within the emulator's 1 s directory
    # cache) and read over S3.
    deadline = time.monotonic() + 10
    while (listed := [o["Key"] for o in s3.list_objects_v2(Bucket="gpukit", Prefix=layout.RUNS_PREFIX)["Contents"]]) \
            != [seen, out]:
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    assert s3.get_object(Bucket="gpukit", Key=out)["Body"].read() == b"hi 15"
    # The secret went in the request body only: not in the emulator's request log or a run record.
    assert "hf_s3cr3t_value" not in repr(emu.requests) and "hf_s3cr3t_value" not in repr(done.detail)


def test_abort_an_infrastructure_loss_and_the_cap_end_a_run_each_its_own_way(emu: Emulator) -> None:
    runs = Executions(LyceumClient.from_env())
    sleeper = Submission(image="img", command=[PY, "-c", "import time; time.sleep(60)"], timeout=600)
    a = runs.start(sleeper)
    _until_state(runs, a.id, "running")
    runs.abort(a.id)
    assert _until_ended(runs, a.id).state == "aborted"
    runs.abort(a.id)  # ended already: nothing to do, no error

    b = runs.start(sleeper)
    _until_state(runs, b.id, "running")
    emu.executions.fail(b.id)  # the machine under it is lost
    assert _until_ended(runs, b.id).state == "system_failure"

    emu.executions.timeout_status = "timeout"  # as older clients see a run killed at its cap
    capped = runs.start(Submission(image="img", command=sleeper.command, timeout=1))
    ex = _until_ended(runs, capped.id, timeout=30)
    assert ex.state == "timeout" and ex.ended

    failing = runs.start(Submission(image="img", command=[PY, "-c", "raise SystemExit(3)"]))
    ex = _until_ended(runs, failing.id)
    assert ex.state == "failed" and ex.detail["exit_code"] == 3


def test_bad_submissions_are_one_line_and_no_secret_reaches_an_error(emu: Emulator) -> None:
    runs = Executions(LyceumClient.from_env())
    for sub, says in [(Submission(image="", command=["true"]), "needs an image"),
                      (Submission(image="i", command=["true"], timeout=601), "outside Lyceum's 1..600"),
                      (Submission(image="i", command=["true"], execution_type="gpu a100"), "not a Lyceum execution"),
                      (Submission(image="i", command=["true"], env={"A": "x\ny"}), "spans lines"),
                      (Submission(image="i", command=["true"], secrets=("NOT_SET_HERE",)), "NOT_SET_HERE is not set")]:
        with pytest.raises(GlueError, match=says) as err:
            runs.start(sub, {})
        assert "\n" not in str(err.value)
    assert not any(path.endswith("/execution/image/start") for _, path, _ in emu.requests)
    # A server that echoes the request in its error never gets the secret into glue's message.
    emu.inject(422, path="/execution/image/start", detail="bad docker_run_env: HF_TOKEN=hf_s3cr3t_value")
    with pytest.raises(GlueError) as err:
        runs.start(Submission(image="i", command=["true"], secrets=("HF_TOKEN",)), {"HF_TOKEN": "hf_s3cr3t_value"})
    assert "hf_s3cr3t_value" not in str(err.value) and "HF_TOKEN=***" in str(err.value)
    # An answer that may hide a started run (a 5xx after sending) is never retried, and says where to look.
    emu.inject(502, path="/execution/image/start", after_processing=True)
    with pytest.raises(GlueError, match="it may have started anyway: check `lyceum workloads list`"):
        runs.start(Submission(image="i", command=["true"]), {})
    assert sum(path.endswith("/execution/image/start") for _, path, _ in emu.requests) == 2  # the 422, this one


def test_state_names_old_and_new() -> None:
    assert [state_of(s) for s in ("queued", "failed_user", "failed_system", "RUNNING", "timeout", "weird", None)] == \
        ["pending", "failed", "system_failure", "running", "timeout", "unknown", "unknown"]

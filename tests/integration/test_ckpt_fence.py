"""Fencing: a trainer whose attempt was replaced (recovery wrote a newer attempt record while it
was paused) commits nothing more and exits non-zero naming the newer attempt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from glue.train import layout
from tests.integration.test_ckpt_toy import run_context_env

ROOT = Path(__file__).resolve().parents[2]
TRAINER = """
import time
import torch
from glue.train import TrainState
from glue.train.run.context import RunContext

with RunContext.from_env() as ctx:
    ck = ctx.checkpointer(handle_sigterm=False)
    ck.register("model", torch.nn.Linear(3, 2))
    ck.register("train", TrainState())
    for step in range(1, 100):
        ck.save(step, blocking=True)
        print("committed", step, flush=True)
        time.sleep(0.5)
"""


def _commits(s3: Any, bucket: str, run: str) -> set[int]:
    resp = s3.list_objects_v2(Bucket=bucket, Prefix=layout.run_prefix(run) + layout.CKPT_PREFIX)
    keys = [o["Key"].removeprefix(layout.run_prefix(run)) for o in resp.get("Contents", [])]
    return {step for k in keys if (step := layout.commit_step(k)) is not None}


@pytest.mark.timeout(120)
def test_replaced_trainer_never_commits_again(local_bucket: Any, tmp_path: Path) -> None:
    run, name = f"fence-{uuid.uuid4().hex[:8]}", local_bucket.info.name
    env = run_context_env(local_bucket, run, tmp_path, GPUKIT_HEARTBEAT_SECONDS="60")
    s3 = local_bucket.client()
    s3.put_object(Bucket=name, Key=layout.run_prefix(run) + layout.attempt_key(1), Body=b'{"attempt": 1}')
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) and line.split() != ["committed", "2"]:
            pass
        assert line, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGSTOP)  # a paused VM: recovery gives up on it and starts attempt 2
        before = _commits(s3, name, run)
        s3.put_object(Bucket=name, Key=layout.run_prefix(run) + layout.attempt_key(2), Body=b'{"attempt": 2}')
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert "attempt 2 of run" in last and "replaced this trainer's attempt 1" in last, last
    assert before == {1, 2}
    time.sleep(0.5)
    assert _commits(s3, name, run) == before, "the replaced trainer committed after its replacement started"

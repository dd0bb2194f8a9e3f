"""memprobe hands a run's `secrets:` to its trials as glue deploy hands them to an attempt: from this shell's
environment into the trial's environment, through the trial's spec (0600), which the trial removes once read;
a secret missing here is one line before any trial runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.memprobe import job
from glue.runs import config as runconfig

TRAIN = "import os\nprint('token seen:', os.environ.get('GPUKIT_TEST_TOKEN') == 'not-a-real-token', flush=True)\n"


def rc() -> runconfig.RunConfig:
    return runconfig.parse({"command": ["python", "train.py"], "secrets": ["GPUKIT_TEST_TOKEN"],
                            "outputs": {"destination": "s3://{bucket}/runs/{run}/outputs"},
                            "checkpoint": {"target": "s3://{bucket}/runs/{run}"}}, "sec", "gpukit")


def test_a_missing_secret_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUKIT_TEST_TOKEN", raising=False)
    with pytest.raises(GlueError) as err:
        job.secrets_env("sec", rc())
    said = str(err.value)
    assert "secret GPUKIT_TEST_TOKEN is not set in this shell's environment" in said and "run memprobe again" in said
    assert "\n" not in said


def test_the_trial_gets_the_secret_and_removes_its_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUKIT_TEST_TOKEN", "not-a-real-token")
    (tmp_path / "train.py").write_text(TRAIN)
    spec = {"argv": [sys.executable, "train.py"], "env": {"PATH": "/usr/bin:/bin", **job.secrets_env("sec", rc())},
            "cwd": str(tmp_path), "changed": {}, "steps": 1, "mode": "trial", "limit_mb": None, "mechanism": "auto",
            "timeout_s": 60, "probe_dir": str(tmp_path / "trial")}
    path = tmp_path / job.SPEC_NAME
    path.write_text(json.dumps(spec))
    path.chmod(0o600)
    res = subprocess.run([sys.executable, "-m", "glue.memprobe.vm_trial", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip().startswith("{"), res.stderr
    assert not path.exists()  # removed once read
    assert "token seen: True" in (tmp_path / "trial" / "trial.log").read_text()
    assert "not-a-real-token" not in res.stdout + res.stderr  # the outcome never carries it

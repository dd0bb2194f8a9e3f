"""The termination notice on the trainer side: SIGTERM or the notice file during evaluation or warm-up
is kept until the next step boundary (a real process, real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A loop with a warm-up and an evaluation phase that each take a while; it reports at every step
# boundary whether the notice is pending, and stops at the first boundary where it is.
TRAINER = """
import json, sys, time
from glue.train.run.notice import TerminationNotice
notice = TerminationNotice(sys.argv[1], poll_s=0.05)
print("ready", flush=True)
time.sleep(float(sys.argv[2]))          # warm-up
for step in range(1, 1000):
    if step % 3 == 0:
        time.sleep(float(sys.argv[3]))  # evaluation
    if notice.pending:
        print(json.dumps({"step": step, "source": notice.source}), flush=True)
        sys.exit(75)
    time.sleep(0.01)
"""


def _start(tmp_path: Path, warmup: float, evaluation: float) -> tuple[subprocess.Popen[str], Path]:
    notice_file = tmp_path / "termination-notice"
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(notice_file), str(warmup), str(evaluation)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, notice_file


@pytest.mark.parametrize("phase", ["warmup", "evaluation"])
def test_sigterm_is_never_missed(tmp_path: Path, phase: str) -> None:
    proc, _ = _start(tmp_path, warmup=1.0 if phase == "warmup" else 0.0, evaluation=1.0)
    time.sleep(0.3 if phase == "warmup" else 0.05)  # inside warm-up, or inside the first evaluation (step 3)
    if phase == "evaluation":
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75, out  # not killed by the signal: it stopped on its own at a boundary
    rec = json.loads(out.strip().splitlines()[-1])
    assert rec["source"] == "SIGTERM" and rec["step"] <= 3


def test_the_notice_file_is_seen(tmp_path: Path) -> None:
    proc, notice_file = _start(tmp_path, warmup=0.0, evaluation=0.5)
    notice_file.write_text("{}")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75
    assert json.loads(out.strip().splitlines()[-1])["source"] == f"notice file {notice_file}"


def test_a_stop_at_deadline_is_a_notice(tmp_path: Path) -> None:
    """Before an execution's cap (GPUKIT_STOP_AT): saved and stopped at the next step boundary, like a notice."""
    stop_at = time.time() + 0.5
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path / "no-notice-file"), "0", "0.2"],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUKIT_STOP_AT": f"{stop_at:.3f}"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75, out
    assert json.loads(out.strip().splitlines()[-1])["source"].startswith(f"stop-at deadline {stop_at:.0f}")
    assert time.time() >= stop_at

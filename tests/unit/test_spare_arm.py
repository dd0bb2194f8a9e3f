"""Arming an idle spare (glue.train.spare.arm) on this machine, no VM: real processes in a test's warm folder.

Arming twice keeps the one trainer-venv warm process and rewrites what it follows (0600); the warm
process of an environment no live run uses any more is ended, and a pid file naming any other process
ends nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glue.train.run.start import SOCKET_ENV, warm_pid
from glue.train.spare import arm


def _stop(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_arming_again_keeps_the_process_and_ends_only_stale_warm_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "warm"
    sock = folder / "trainer.sock"
    monkeypatch.setenv(SOCKET_ENV, str(sock))
    spec: dict[str, Any] = {"bucket": {"name": "b", "endpoint": "http://127.0.0.1:9", "region": "us-east-1"},
            "credentials_file": None, "image": {"runs": ["r1"]}, "envs": []}
    folder.mkdir(mode=0o700)
    # an environment's warm process no run uses any more, and a pid file naming another process
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "glue.train.run.warm"])
    other = subprocess.Popen(["sleep", "120"])
    (folder / "env-aaaaaaaaaaaaaaaa.sock.pid").write_text(f"{stale.pid}\n")
    (folder / "env-bbbbbbbbbbbbbbbb.sock.pid").write_text(f"{other.pid}\n")
    (folder / "env-aaaaaaaaaaaaaaaa.sock.follow.json").write_text("{}")
    started = None
    try:
        first = arm.arm(spec)
        started = warm_pid(f"{sock}.starting") or warm_pid(f"{sock}.pid")
        assert started is not None, f"{os.listdir(folder)} {(folder / 'warm.log').read_text()}"
        assert first["trainer"] == "started"
        assert sorted(first["ended"]) == [stale.pid]
        assert stale.wait(timeout=30) == -signal.SIGTERM
        assert other.poll() is None  # not a warm process: left alone
        assert not (folder / "env-aaaaaaaaaaaaaaaa.sock.follow.json").exists()

        second = arm.arm({**spec, "image": {"runs": ["r1", "r2"], "env": {"HF_HUB_OFFLINE": "1"},
                                            "secrets": ["WANDB_API_KEY"]}})
        assert second == {"trainer": "running", "envs": [], "ended": []}
        assert (warm_pid(f"{sock}.starting") or warm_pid(f"{sock}.pid")) == started
        follow = Path(f"{sock}.follow.json")
        assert json.loads(follow.read_text()) == {**{k: spec[k] for k in ("bucket", "credentials_file")},
                                                  "runs": ["r1", "r2"], "env": {"HF_HUB_OFFLINE": "1"},
                                                  "secrets": ["WANDB_API_KEY"]}  # read again by the running process
        assert stat.S_IMODE(follow.stat().st_mode) == 0o600
        deadline = time.monotonic() + 120
        while warm_pid(f"{sock}.pid") != started:  # it loads, then listens under its own mark
            assert time.monotonic() < deadline, (folder / "warm.log").read_text()
            time.sleep(0.2)
        assert not Path(f"{sock}.starting").exists()
    finally:
        _stop(started)
        stale.kill()
        other.kill()


def test_a_slurm_clusters_spares_hold_no_warm_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm starts its jobs on a spare through its batch script: a warm process could never take one and would
    only hold memory beside it. Without Slurm the same spare is armed."""
    from types import SimpleNamespace

    from rich.console import Console

    from glue.cluster.current import ClusterConfig
    from glue.infra.inventory import Host
    from glue.operations import warm_spares

    armed: list[str] = []

    def arm_one(home: Path, host: Host, spec: dict[str, Any], creds: bytes) -> dict[str, Any]:
        armed.append(host.name)  # the SSH call to the spare, recorded instead of made
        return {"trainer": "started", "envs": []}

    monkeypatch.setattr(warm_spares, "_arm_one", arm_one)
    monkeypatch.setattr(warm_spares.current, "bucket_info", lambda home: SimpleNamespace(
        name="gpukit", endpoint="http://127.0.0.1:9", signing_region="us-east-1"))
    spare = Host(name="gpukit-spare-1", id="x", ssh_host="127.0.0.1", ssh_port=9, ssh_user="root", host_key="",
                 gpu_type="none", gpu_count=0, backend="local")
    ClusterConfig(vms=2, spares=1, scheduler="slurm").save(tmp_path)
    assert warm_spares.arm(tmp_path, Console(quiet=True), [spare], warm_spares.LiveRuns()) == [] and armed == []
    ClusterConfig(vms=2, spares=1).save(tmp_path)
    assert warm_spares.arm(tmp_path, Console(quiet=True), [spare], warm_spares.LiveRuns()) == ["gpukit-spare-1"]
    assert armed == ["gpukit-spare-1"]

"""An attempt's pids name its processes only while their start times match the supervisor's record: a VM reuses
pids within minutes, and `glue stop` or a recovery of an ended attempt on a shared VM must never signal the
neighbour run's process that took one of its pids. The probe and the signal scripts run here in a
real shell against real processes; only the SSH hop is left out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.infra import ssh
from glue.runs import remote
from glue.train.run.supervise import start_ticks
from glue.train.state_paths import StatePaths

HOST = object()


@pytest.fixture
def on_this_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """remote's scripts run by /bin/sh here, its state paths under tmp_path."""
    def run(home: Path, host: object, command: str, timeout: float = 600, stream: bool = False) -> ssh.CommandResult:
        res = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return ssh.CommandResult(res.returncode, res.stdout, res.stderr)

    monkeypatch.setattr(remote.ssh, "run", run)
    monkeypatch.setattr(remote.StatePaths, "of", classmethod(lambda cls, run, n: StatePaths(str(tmp_path), n)))
    return tmp_path


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """Another run's process (with a child of its own) that took a pid an ended attempt recorded."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    yield proc
    subprocess.run(["pkill", "-9", "-P", str(proc.pid)], check=False)
    proc.kill()
    proc.wait()


def _pids_file(folder: Path, pid: int, start: int | None) -> None:
    doc: dict[str, object] = {"supervisor_pid": pid, "trainer_pid": pid, "started_at": "2026-12-07T21:00:00Z"}
    if start is not None:
        doc |= {"supervisor_start": start, "trainer_start": start}
    Path(StatePaths(str(folder), 1).pids).write_text(json.dumps(doc))


def _gone_within(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


def test_a_pid_another_process_took_is_gone_and_is_never_signalled(
        on_this_machine: Path, neighbour: subprocess.Popen[bytes]) -> None:
    _pids_file(on_this_machine, neighbour.pid, start_ticks(neighbour.pid) + 1)  # the recorded one started earlier
    state = remote.process_state(Path("/"), HOST, "r", 1)  # type: ignore[arg-type]
    assert (state["supervisor"], state["trainer"]) == ("gone", "gone"), state
    remote.signal_processes(Path("/"), HOST, "r", 1)  # type: ignore[arg-type]
    assert not _gone_within(neighbour, 1.0), "the process that took the pid was killed"


def test_the_recorded_process_is_probed_and_killed_with_its_children(
        on_this_machine: Path, neighbour: subprocess.Popen[bytes]) -> None:
    children = subprocess.run(["pgrep", "-P", str(neighbour.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the attempt's child did not start"
    _pids_file(on_this_machine, neighbour.pid, start_ticks(neighbour.pid))
    state = remote.process_state(Path("/"), HOST, "r", 1)  # type: ignore[arg-type]
    assert state["trainer"] in ("S", "R"), state
    remote.signal_processes(Path("/"), HOST, "r", 1, "KILL")  # type: ignore[arg-type]
    assert _gone_within(neighbour, 5.0)
    assert not any(Path(f"/proc/{c}").exists() and "sleep" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")
                   for c in children), "its child lives on"


def test_a_pids_file_without_start_times_is_trusted_as_before(
        on_this_machine: Path, neighbour: subprocess.Popen[bytes]) -> None:
    _pids_file(on_this_machine, neighbour.pid, None)  # written by a supervisor from before start times
    assert remote.process_state(Path("/"), HOST, "r", 1)["trainer"] in ("S", "R")  # type: ignore[arg-type]
    remote.signal_processes(Path("/"), HOST, "r", 1, "STOP")  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    while remote.process_state(Path("/"), HOST, "r", 1)["trainer"] != "T":  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "not stopped"
        time.sleep(0.05)
    neighbour.send_signal(signal.SIGCONT)


def test_start_ticks_names_a_process_and_is_zero_once_it_is_gone() -> None:
    assert start_ticks(os.getpid()) > 0
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert start_ticks(proc.pid) == 0

"""`glue watch --detach` where systemd is PID 1 (not on this machine): the transient unit's command and
properties checked by systemd itself (`systemd-analyze verify`, offline), and start/status/stop
through stand-ins for systemd-run and systemctl that record what they were asked."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glue.watch import service

FAKE = """#!/bin/sh
printf '%s\\n' "$0 $*" >> {log}
case "$1" in
  is-active) if [ -e {stopped} ]; then echo inactive; exit 3; else echo active; fi ;;
  stop) touch {stopped} ;;
esac
"""


@pytest.fixture
def fake_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("systemd-run", "systemctl"):
        path = bin_dir / name
        path.write_text(FAKE.format(log=shlex.quote(str(log)), stopped=shlex.quote(str(tmp_path / "stopped"))))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(service, "systemd_here", lambda: True)
    return log


def test_start_status_stop_go_through_systemd(fake_systemd: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    unit = service._unit(home)
    said = service.start(home, ["--run", "r1", "--interval", "1"])
    assert unit in said and "journalctl" in said
    run_call = fake_systemd.read_text().splitlines()[0].split()
    assert run_call[0].endswith("systemd-run") and f"--unit={unit}" in run_call
    assert "--property=Restart=on-failure" in run_call and f"--setenv=GPUKIT_HOME={home}" in run_call
    assert run_call[-8:] == [sys.executable, "-m", "glue.cli", "watch", "--run", "r1", "--interval", "1"]
    st = service.status(home)
    assert st["mode"] == "systemd" and st["unit"] == unit and st["running"] is True
    assert service.stop(home) == f"stopped {unit}"
    assert service.status(home)["running"] is False
    calls = fake_systemd.read_text()
    assert f"is-active {unit}" in calls and f"stop {unit}" in calls


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_transient_unit_is_valid_for_systemd(tmp_path: Path) -> None:
    """The same command, environment and properties as a unit file, verified offline by systemd."""
    home = tmp_path / "home"
    argv = service.systemd_run_argv(home, ["--run", "r1", "--interval", "1", "--keep-failed"])
    unit = next(a.split("=", 1)[1] for a in argv if a.startswith("--unit="))
    props = [a.split("=", 1)[1] for a in argv if a.startswith("--property=")]
    env = [a.split("=", 1)[1] for a in argv if a.startswith("--setenv=")]
    command = argv[argv.index(sys.executable):]
    path = tmp_path / f"{unit}.service"
    path.write_text("[Unit]\nDescription=glue watch\n\n[Service]\n"
                    f"ExecStart={shlex.join(command)}\n" + "".join(f"Environment={e}\n" for e in env)
                    + "".join(f"{p}\n" for p in props))
    res = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0 and unit not in res.stderr, res.stderr  # warnings name the unit
    assert set(service.UNIT_PROPERTIES) == set(props) and env == [f"GPUKIT_HOME={home}"]

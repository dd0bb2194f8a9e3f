"""`glue watch --detach`: the watcher as a supervised service.

Where systemd is PID 1, a transient systemd unit (`systemd-run`, Restart=on-failure; a user unit when
not root). Elsewhere (containers, this kind of machine) a daemon of our own: a small supervisor in
its own session restarts the watcher when it dies unexpectedly (backoff 1 s doubling to 60 s), with
its pid in <home>/watch/watch.pid and both logs in <home>/watch/watch.log. `--status` reads those and
the watcher's last table (<home>/watch/status.json); `--stop` ends the supervisor, which ends the
watcher.

    python -m glue.watch.service <home> <watch args...>     (what --detach starts)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.process import pid_alive

STOP_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0  # the supervisor kills a watcher that has not ended this long after SIGTERM


def watch_dir(home: Path) -> Path:
    path = home / "watch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _unit(home: Path) -> str:
    return "gpukit-watch-" + hashlib.sha256(str(home).encode()).hexdigest()[:8]


def systemd_here() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd" and shutil.which("systemd-run") is not None
    except OSError:
        return False




def _pid(home: Path) -> int | None:
    try:
        pid = int((watch_dir(home) / "watch.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def _systemctl(*args: str) -> list[str]:
    return ["systemctl", *([] if os.geteuid() == 0 else ["--user"]), *args]


# The transient unit's service properties (systemd.service(5)): restarted when the watcher dies.
UNIT_PROPERTIES = ("Restart=on-failure", "RestartSec=5")


def systemd_run_argv(home: Path, args: list[str]) -> list[str]:
    """`systemd-run` of the watcher as a transient service (a user unit when not root)."""
    return ["systemd-run", *([] if os.geteuid() == 0 else ["--user"]), f"--unit={_unit(home)}",
            *(f"--property={p}" for p in UNIT_PROPERTIES), f"--setenv=GPUKIT_HOME={home}",
            sys.executable, "-m", "glue.cli", "watch", *args]


def start(home: Path, args: list[str]) -> str:
    """Start the detached watcher with `glue watch` arguments `args`; returns how to follow it."""
    if systemd_here():
        unit = _unit(home)
        proc = subprocess.run(systemd_run_argv(home, args), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise GlueError(f"systemd-run failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        return f"systemd unit {unit} (journalctl {'' if os.geteuid() == 0 else '--user '}-u {unit} -f)"
    running = _pid(home)
    if running is not None:
        raise GlueError(f"a detached watcher already runs for {home} (pid {running}); `glue watch --stop` first")
    log = watch_dir(home) / "watch.log"
    with open(log, "ab") as out:
        proc2 = subprocess.Popen([sys.executable, "-m", "glue.watch.service", str(home), *args],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, "GPUKIT_HOME": str(home)})
    deadline = time.monotonic() + 10
    while _pid(home) != proc2.pid and time.monotonic() < deadline:
        if proc2.poll() is not None:
            raise GlueError(f"the detached watcher exited at once ({proc2.returncode}); see {log}")
        time.sleep(0.1)
    return f"pid {proc2.pid}, log {log}"


def status(home: Path) -> dict[str, Any]:
    """{"running", "mode", "pid"/"unit", "log", "table" (the watcher's last poll), "updated_at"}."""
    last: dict[str, Any] = {}
    try:
        last = json.loads((watch_dir(home) / "status.json").read_text())
    except (OSError, ValueError):
        pass
    out: dict[str, Any] = {"home": str(home), "table": last.get("rows", []), "updated_at": last.get("updated_at")}
    if systemd_here():
        unit = _unit(home)
        active = subprocess.run(_systemctl("is-active", unit), capture_output=True, text=True, check=False)
        return {**out, "mode": "systemd", "unit": unit, "running": active.stdout.strip() == "active"}
    pid = _pid(home)
    return {**out, "mode": "daemon", "pid": pid, "running": pid is not None,
            "log": str(watch_dir(home) / "watch.log")}


def stop(home: Path) -> str:
    if systemd_here():
        unit = _unit(home)
        proc = subprocess.run(_systemctl("stop", unit), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise GlueError(f"systemctl stop {unit} failed: {proc.stderr.strip()}")
        return f"stopped {unit}"
    pid = _pid(home)
    if pid is None:
        raise GlueError(f"no detached watcher runs for {home}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        raise GlueError(f"the watcher (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f}s")
    (watch_dir(home) / "watch.pid").unlink(missing_ok=True)
    return f"stopped pid {pid}"


def supervise(home: Path, args: list[str]) -> int:
    """Run `glue watch <args>` and start it again when it dies unexpectedly; SIGTERM ends both."""
    pidfile = watch_dir(home) / "watch.pid"
    pidfile.write_text(str(os.getpid()))
    child: subprocess.Popen[bytes] | None = None
    stop_asked = 0.0  # monotonic time of the SIGTERM; 0 while running

    def on_term(signum: int, _frame: object) -> None:
        nonlocal stop_asked
        stop_asked = stop_asked or time.monotonic()
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    delay = 1.0
    try:
        while not stop_asked:
            t0 = time.monotonic()
            child = subprocess.Popen([sys.executable, "-m", "glue.cli", "watch", *args], stdin=subprocess.DEVNULL)
            if stop_asked:  # the stop came while the new watcher was being started: it never saw the signal
                child.send_signal(signal.SIGTERM)
            code: int | None = None
            while True:
                try:
                    code = child.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    # A watcher stuck in a slow call must not outlive `glue watch --stop`.
                    if stop_asked and time.monotonic() - stop_asked > STOP_GRACE_S:
                        print(f"the watcher (pid {child.pid}) did not end {STOP_GRACE_S:.0f}s after SIGTERM; "
                              "killing it", flush=True)
                        child.kill()
            if stop_asked or code == 0:
                return 0
            delay = 1.0 if time.monotonic() - t0 > 60 else min(delay * 2, 60.0)
            print(f"glue watch exited {code}; starting it again in {delay:.0f}s", flush=True)
            time.sleep(delay)
        return 0
    finally:
        if pidfile.exists() and pidfile.read_text().strip() == str(os.getpid()):
            pidfile.unlink()


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), sys.argv[2:]))

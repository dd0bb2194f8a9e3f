"""A warm trainer process on each idle spare (glue.train.run.warm): the trainer venv's interpreter with
torch and the trainer library loaded, waiting for the attempt a recovery starts on the spare.

arm      after `glue up` and after a refill converged the pool: each spare whose warm process is not
         running gets one (detached, its own session; log /run/gpukit/warm/warm.log on the VM). A spare
         taken by a recovery has its process consumed by the attempt (it becomes that attempt's supervisor);
         the refill's new spare is armed in turn. A spare that could not be armed still serves: its
         attempt starts cold, and the recovery says so.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import remote
from glue.runs.records import AttemptNode
from glue.train.run.start import WARM_DIR, WARM_SOCKET

PID_FILE = f"{WARM_SOCKET}.pid"  # written by the warm process once it listens; gone once it took an attempt
STARTING = f"{WARM_DIR}/starting.pid"  # the process started and still loading


def arm_script(python: str) -> str:
    """Start the warm process unless one is running (listening or still loading); prints what it did."""
    py = shlex.quote(python)
    alive = ("alive() { p=$(cat \"$1\" 2>/dev/null) && [ -n \"$p\" ] && "
             "grep -q glue.train.run.warm /proc/$p/cmdline 2>/dev/null; }; ")
    return (f"mkdir -p -m 0700 {WARM_DIR} && chmod 0700 {WARM_DIR} && {alive}"
            f"if alive {PID_FILE} || alive {STARTING}; then echo running; else cd / && "
            f"{{ setsid {py} -m glue.train.run.warm {WARM_SOCKET} </dev/null >>{WARM_DIR}/warm.log 2>&1 & "
            f"echo $! >{STARTING}; }}; echo started; fi")


def arm(home: Path, console: Console, spares: list[Host]) -> list[str]:
    """A warm trainer process on each of `spares` (idle ones only). Returns the names where one was started
    now; a spare that could not be armed is named with why (it serves anyway, starting its trainer cold)."""
    started: list[str] = []
    for host in spares:
        try:
            res = ssh.run(home, host, arm_script(remote.python(host)), timeout=30)
        except (GlueError, OSError) as exc:
            console.print(f"[yellow]spare {host.name}[/]: no warm trainer process ({exc}); an attempt there "
                          "starts cold")
            continue
        if res.exit_code != 0:
            console.print(f"[yellow]spare {host.name}[/]: no warm trainer process ({res.stderr.strip()}); an "
                          "attempt there starts cold")
        elif "started" in res.stdout:
            started.append(host.name)
    if started:
        console.print(f"warm trainer process started on {', '.join(started)}")
    return started


def trainer_start(node: AttemptNode) -> dict[str, str]:
    """How an attempt node's trainer started, from its pids (read into the attempt record's node):
    {"start": "warm"} or {"start": "cold", "cold_reason": why, when a warm process was there}."""
    how = {"start": str(node.start or "cold")}
    if node.cold_reason:
        how["cold_reason"] = str(node.cold_reason)
    return how


def say_start(console: Console, names: list[str], nodes: list[AttemptNode], spares: set[str]) -> None:
    """One line per spare the attempt started on: warm, or cold and why."""
    for name, node in zip(names, nodes, strict=False):
        if name not in spares:
            continue
        how = trainer_start(node)
        if how["start"] == "warm":
            console.print(f"start: the trainer on {name} started warm (the spare's warm trainer process took it)")
        else:
            why = how.get("cold_reason") or "no warm trainer process was waiting on the spare"
            console.print(f"[yellow]start[/]: the trainer on {name} started cold: {why}")

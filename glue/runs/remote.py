"""Where things live on a VM, and small remote probes used by deploy and the monitor."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.train.state_paths import StatePaths
from glue.train.storage.credentials import TRAINER_FILE

CREDENTIALS_PATH = TRAINER_FILE
SCRATCH = "/var/lib/gpukit/scratch"
REAL_VM_VENV = "/opt/gpukit/venv"


LOG_MARK = "--- gpukit log tail ---"
LOG_TAIL_LINES = 12


def venv(host: Host) -> str:
    """The trainer runtime's venv: baked into the gpukit image, installed by the trainer role elsewhere."""
    return REAL_VM_VENV


def python(host: Host) -> str:
    return f"{venv(host)}/bin/python"


def env_info(home: Path, host: Host) -> dict[str, Any]:
    res = ssh.run(home, host, f"{shlex.quote(python(host))} -m glue.train.run.envinfo", timeout=120)
    if res.exit_code != 0:
        raise GlueError(f"{host.name}: the trainer runtime does not start ({res.stderr.strip().splitlines()[-1:]}); "
                        "re-run the playbook with `glue up`")
    return dict(json.loads(res.stdout))


# A pid names an attempt's process only while that process's start time (clock ticks since boot, field 22 of
# /proc/<pid>/stat) is the one its supervisor recorded beside it: a busy VM goes through its 32768 pids in
# minutes (every thread takes one), and a probe or a kill of an ended attempt must never reach the process
# that took its pid (another run's trainer on a shared VM). Sets $1 (state letter) and ${20} (start) of $p.
_STAT = "x=$(sed 's/^.*) //' /proc/$p/stat 2>/dev/null) || continue; set -- $x"
ROLES = ("supervisor", "trainer")


def process_state(home: Path, host: Host, run: str, attempt: int) -> dict[str, Any]:
    """pids of the attempt and each one's state letter (R, S, T, Z...), or "gone" when it ended or its pid now
    names another process; and the last lines of its log on the VM (`log_tail`: what it said while the
    bucket, where its log is shipped, was away)."""
    paths = StatePaths.of(run, attempt)
    pids_file = paths.pids
    script = (
        f"cat {pids_file} 2>/dev/null || echo '{{}}'; echo; "
        f"for p in $(grep -o '_pid\": *[0-9]*' {pids_file} 2>/dev/null | grep -o '[0-9]*$'); do "
        f"  {_STAT}; echo \"$p $1 ${{20}}\"; done; "
        f"echo {LOG_MARK}; tail -n {LOG_TAIL_LINES} {paths.log} 2>/dev/null || true"
    )
    res = ssh.run(home, host, script, timeout=20)
    head, _, log_tail = res.stdout.partition(f"{LOG_MARK}\n")
    lines = head.strip().splitlines()
    pids = json.loads(lines[0]) if lines and lines[0].startswith("{") else {}
    live = {row[0]: row[1:] for line in lines[1:] if len(row := line.split()) == 3}
    return {"pids": pids, **{role: _state_of(pids, role, live) for role in ROLES}, "log_tail": log_tail}


def _state_of(pids: dict[str, Any], role: str, live: dict[str, list[str]]) -> str:
    found = live.get(str(pids.get(f"{role}_pid")))
    recorded = pids.get(f"{role}_start")  # absent: a pids file from before start times were recorded
    if found is None or (recorded is not None and str(recorded) != found[1]):
        return "gone"
    return found[0]


def signal_processes(home: Path, host: Host, run: str, attempt: int, sig: str = "KILL") -> None:
    """Send `sig` (KILL; STOP to freeze a kept VM's attempt) to an attempt's supervisor and trainer, each still
    the process its supervisor recorded (checked on the VM, just before), and their children and grandchildren
    (torchrun starts its workers in sessions of their own, so signalling the process group would miss them)."""
    pids = process_state(home, host, run, attempt)["pids"]
    pairs = [f"{pids[f'{r}_pid']}:{pids.get(f'{r}_start', '')}" for r in ROLES if isinstance(pids.get(f"{r}_pid"), int)]
    if not pairs:
        return
    script = (f"all=''; for ps in {' '.join(pairs)}; do p=${{ps%:*}}; s=${{ps#*:}}; {_STAT}; "
              "[ -z \"$s\" ] || [ \"${20}\" = \"$s\" ] && all=\"$all $p\"; done; "
              "for p in $all; do for c in $(pgrep -P $p); do all=\"$all $c $(pgrep -P $c | tr '\\n' ' ')\"; done; "
              "done; "
              f"[ -n \"$all\" ] && kill -{sig} $all 2>/dev/null; true")
    ssh.run(home, host, script, timeout=20)

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


def process_state(home: Path, host: Host, run: str, attempt: int) -> dict[str, Any]:
    """pids of the attempt and each one's state letter (R, S, T, Z...) or None when gone; and the last lines
    of its log on the VM (`log_tail`: what it said while the bucket, where its log is shipped, was away)."""
    paths = StatePaths.of(run, attempt)
    pids_file = paths.pids
    script = (
        f"cat {pids_file} 2>/dev/null || echo '{{}}'; echo; "
        f"for p in $(grep -o '[0-9]\\+' {pids_file} 2>/dev/null); do "
        "  s=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | cut -d' ' -f2); echo \"$p ${s:-gone}\"; done; "
        f"echo {LOG_MARK}; tail -n {LOG_TAIL_LINES} {paths.log} 2>/dev/null || true"
    )
    res = ssh.run(home, host, script, timeout=20)
    head, _, log_tail = res.stdout.partition(f"{LOG_MARK}\n")
    lines = head.strip().splitlines()
    pids = json.loads(lines[0]) if lines and lines[0].startswith("{") else {}
    states = dict(line.split() for line in lines[1:] if len(line.split()) == 2)
    return {
        "pids": pids,
        "supervisor": states.get(str(pids.get("supervisor_pid")), "gone") if pids else "gone",
        "trainer": states.get(str(pids.get("trainer_pid")), "gone") if pids else "gone",
        "log_tail": log_tail,
    }


def kill_processes(home: Path, host: Host, run: str, attempt: int) -> None:
    """SIGKILL an attempt's supervisor, trainer and the trainer's children and grandchildren (torchrun
    starts its workers in sessions of their own, so killing the process group would miss them)."""
    pids = [int(p) for k, p in process_state(home, host, run, attempt)["pids"].items()
            if k.endswith("_pid") and isinstance(p, int)]
    if not pids:
        return
    script = (f"all='{' '.join(map(str, pids))}'; for p in $all; do for c in $(pgrep -P $p); do "
              "all=\"$all $c $(pgrep -P $c | tr '\\n' ' ')\"; done; done; kill -9 $all 2>/dev/null; true")
    ssh.run(home, host, script, timeout=20)

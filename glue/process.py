"""Whether a process of this machine still runs (the VMs' init, the local bucket server, the holder
of a run's lease, the watch daemon), and when it started (so a reused PID is not taken for it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by its parent) still answers kill(0) but is gone: it holds
    nothing and will never release what it held."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if not fields:
        return False  # it exited between the two looks
    return fields[0] != "Z"


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None when it is gone."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def cpu_seconds(pid: int) -> float | None:
    """CPU time the process has used (user + system), or None when it is gone: a budget in CPU time holds
    on a busy host, where one in wall time fails a machine that was only waiting for a core."""
    fields = _stat(pid)
    if len(fields) <= 12:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces): state, ppid, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def children(pid: int) -> list[int]:
    """The direct children of every thread of `pid`; [] once it is gone (a process that exits while its
    tree is walked is a normal moment at boot and teardown, not an error)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for task in tasks:
        try:
            out += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def command_lines(proc: Path = Path("/proc")) -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every process of this machine whose command line can be read (one gone meanwhile, or
    not ours to read, is skipped)."""
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(d.name), raw.decode(errors="replace").split("\0")

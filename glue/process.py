"""Whether a process of this machine still runs: the VMs' init, the local bucket server, the holder
of a run's lease, the watch daemon."""

from __future__ import annotations

import os
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
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False  # it exited between the two looks
    return state != "Z"

"""What the ssh backend knows of the file's hosts, in <home>/ssh-hosts/state.json: each host's pinned key,
which hosts the cluster holds (host id -> VM name), which are lost (kept out until `glue up` finds them
healthy again), which still carry gpukit's files from a run they lost (released when they answer again),
what each held before gpukit took it, when each was last released (a replacement prefers another), and
the GPUs the host checks found on each (or its labels said).

Changed under a lock (terraform creates VMs in parallel threads, and glue runs beside the provider)."""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from glue.cloud.jumps import Jump
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError

_thread_lock = threading.Lock()


@dataclass
class HostsState:
    pins: dict[str, str] = field(default_factory=dict)  # host id (or "jump user@addr:port") -> "ssh-ed25519 AAAA..."
    taken: dict[str, str] = field(default_factory=dict)  # host id -> the VM name it serves as
    lost: dict[str, str] = field(default_factory=dict)  # host id -> why and since when
    dirty: list[str] = field(default_factory=list)  # lost while taken: gpukit's files still on it
    before: dict[str, list[str]] = field(default_factory=dict)  # host id -> gpukit paths it had before
    released_at: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, list[str | int]] = field(default_factory=dict)  # host id -> [gpu_type, gpu_count]


def via(st: HostsState, host: HostEntry) -> Jump | None:
    """The host's jump with its pinned key (None: reached directly)."""
    return host.jump(st.pins.get(host.jump_id or "", ""))


def _path(home: Path) -> Path:
    return home / "ssh-hosts" / "state.json"


def read(home: Path) -> HostsState:
    try:
        raw = json.loads(_path(home).read_text())
    except FileNotFoundError:
        return HostsState()
    except (OSError, ValueError) as exc:
        raise GlueError(f"{_path(home)} cannot be read ({exc}); restore it, or remove it and release the hosts "
                        "by hand (every host's key is then asked again)") from None
    return HostsState(**{k: v for k, v in raw.items() if k in HostsState.__dataclass_fields__})


@contextmanager
def changing(home: Path) -> Iterator[HostsState]:
    """The state, written back when the block ends without an error; one writer at a time."""
    path = _path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        st = read(home)
        yield st
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(st), indent=1, sort_keys=True))
        tmp.replace(path)

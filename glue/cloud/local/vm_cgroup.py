"""A machine VM's own cgroup on this host: its memory and CPU limits, and a subtree it may write.

A cloud VM's root owns its cgroups: the trainer's memory limit (`glue deploy --memory-limit-mb`,
memprobe) is a child cgroup made on the VM. A systemd-nspawn machine gets a cgroup namespace rooted
at the cgroup it starts in, so each machine starts in its own (`gpukit/<vm-id>` under each controller),
where the VM's limits are set. nspawn mounts the v1 controller hierarchies read-only inside; `delegate`
makes the machine's memory and cpu views writable again, which on the host is only that subtree.
cgroup v1 (hybrid, as here) and v2 are both handled; where neither is writable the VM runs unlimited.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu")
CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """0 = unlimited."""

    memory_mb: int = 0
    cpus: int = 0


def _v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def create(vm_id: str, limits: Limits) -> list[Path]:
    """The VM's cgroup directories (one per v1 controller, or one v2 group) with its limits set;
    [] where no cgroup can be made (not root, no controller mounted)."""
    try:
        return _create_v2(vm_id, limits) if _v2() else _create_v1(vm_id, limits)
    except OSError:
        return []


def _create_v1(vm_id: str, limits: Limits) -> list[Path]:
    paths = []
    for controller in V1_CONTROLLERS:
        base = ROOT / controller
        if not (base / "cgroup.procs").exists():
            continue
        path = base / "gpukit" / vm_id
        path.mkdir(parents=True, exist_ok=True)
        paths.append(path)
        if controller == "memory" and limits.memory_mb:
            (path / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
        if controller == "cpu" and limits.cpus:
            (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(limits.cpus * CFS_PERIOD_US))
    return paths


def _create_v2(vm_id: str, limits: Limits) -> list[Path]:
    parent = ROOT / "gpukit"
    parent.mkdir(exist_ok=True)
    for level in (ROOT, parent):  # the controllers must be enabled on the way down
        try:
            (level / "cgroup.subtree_control").write_text("+memory +cpu")
        except OSError:
            pass  # not available here: the group is still made, without that limit
    path = parent / vm_id
    path.mkdir(exist_ok=True)
    if limits.memory_mb and (path / "memory.max").exists():
        (path / "memory.max").write_text(str(limits.memory_mb * 2**20))
    if limits.cpus and (path / "cpu.max").exists():
        (path / "cpu.max").write_text(f"{limits.cpus * CFS_PERIOD_US} {CFS_PERIOD_US}")
    return [path]


def delegate(init_pid: int) -> None:
    """Make the machine's own cgroup subtree writable inside it (v1: nspawn mounts it read-only).
    Run from the host in the machine's mount namespace; a v2 machine's cgroup2 mount is already writable."""
    if _v2():
        return
    for controller in V1_CONTROLLERS:
        subprocess.run(["nsenter", "-t", str(init_pid), "-m", "mount", "-o", "remount,bind,rw",
                        f"/sys/fs/cgroup/{controller}"], capture_output=True, check=False, timeout=10)


def remove(paths: list[str]) -> None:
    """Remove the VM's cgroups once its processes are gone: children first (the trainer's, systemd's)."""
    for top in paths:
        # Bottom-up: children first, the VM's own cgroup last. Two teardowns of one VM may race (a watcher's
        # read_vm finding it gone while `glue down` or a recovery deletes it): os.walk skips a directory the
        # other one removed meanwhile, where rglob raised and the watcher died.
        for d in [Path(root) for root, _, _ in os.walk(top, topdown=False)]:
            for _ in range(50):  # a killed process leaves its cgroup a moment after the kill
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)

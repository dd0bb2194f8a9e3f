"""Backends behind one small interface (glue.cloud.base.Backend); one module per cloud."""

from __future__ import annotations

import os
from pathlib import Path

from glue.cloud.base import Backend
from glue.errors import GlueError

BACKENDS = ("local", "lyceum", "qemu")
# Which local VMs: "machine" boots the baked image (systemd-nspawn); "overlay" overlays the host root.
LOCAL_VMS_ENV = "GPUKIT_LOCAL_VMS"


LOCAL_VMS = ("machine", "overlay")


def local_vms() -> str:
    kind = os.environ.get(LOCAL_VMS_ENV) or "overlay"
    if kind not in LOCAL_VMS:
        raise GlueError(f"{LOCAL_VMS_ENV}={kind!r}: choose one of {', '.join(LOCAL_VMS)}")
    return kind


def get_backend(name: str, home: Path) -> Backend:
    """The backend called `name`, with kit state under `home`."""
    if name == "local" and local_vms() == "machine":
        from glue.cloud.local.machine_backend import MachineBackend

        return MachineBackend(home)
    if name == "local":
        from glue.cloud.local.backend import LocalBackend

        return LocalBackend(home)
    if name == "lyceum":
        from glue.cloud.lyceum.backend import LyceumBackend

        return LyceumBackend(home)
    if name == "qemu":
        from glue.cloud.qemu.backend import QemuBackend

        return QemuBackend(home)
    raise GlueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")

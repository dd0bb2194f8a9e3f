"""Backends behind one small interface (glue.cloud.base.Backend); one module per cloud."""

from __future__ import annotations

from pathlib import Path

from glue.cloud.base import Backend
from glue.errors import GlueError

BACKENDS = ("local", "lyceum", "qemu", "ssh", "terraform")


def get_backend(name: str, home: Path) -> Backend:
    """The backend called `name`, with kit state under `home`."""
    if name == "local":
        from glue.cloud.local.backend import LocalBackend

        return LocalBackend(home)
    if name == "lyceum":
        from glue.cloud.lyceum.backend import LyceumBackend

        return LyceumBackend(home)
    if name == "qemu":
        from glue.cloud.qemu.backend import QemuBackend

        return QemuBackend(home)
    if name == "ssh":
        from glue.cloud.ssh.backend import SshBackend

        return SshBackend(home)
    if name == "terraform":
        from glue.cloud.terraform.backend import TerraformBackend

        return TerraformBackend(home)
    raise GlueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")

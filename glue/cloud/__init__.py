"""Backends behind one small interface (glue.cloud.base.Backend); one module per cloud."""

from __future__ import annotations

from pathlib import Path

from glue.cloud.base import Backend
from glue.errors import GlueError

BACKENDS = ("local", "lyceum", "qemu", "ssh", "terraform")


def get_backend(name: str, home: Path) -> Backend:
    """The backend called `name`, with kit state under `home`; with the user's own bucket where `glue up`
    configured one (glue.cloud.own_bucket; its record is glue.bucket_access.own.record_path)."""
    backend = _backend(name, home)
    if not (home / "bucket" / "own.json").exists():
        return backend  # the usual case costs no import (pydantic, boto3)
    from glue.cloud.own_bucket import wrap

    return wrap(backend, home)


def _backend(name: str, home: Path) -> Backend:
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

from pathlib import Path

import pytest

from glue.cloud.local import nspawn
from glue.errors import GlueError
from glue.infra import preflight


def test_missing_nspawn_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = nspawn.shutil.which
    monkeypatch.setattr(nspawn.shutil, "which",
                        lambda n, path=None: None if n == "systemd-nspawn" else real_which(n, path=path))
    with pytest.raises(GlueError, match="systemd-container"):
        preflight.check_local_backend()


def test_missing_fuse_device_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "FUSE", Path("/nonexistent/fuse"))
    with pytest.raises(GlueError, match="fuse3"):
        preflight.check_local_backend()


def test_qemu_needs_nspawn_for_the_boot_disks_docker_base(monkeypatch: pytest.MonkeyPatch) -> None:
    from glue.images import docker_seed

    real_which = docker_seed.shutil.which
    monkeypatch.setattr(docker_seed.shutil, "which",
                        lambda n, path=None: None if n == "systemd-nspawn" else real_which(n, path=path))
    with pytest.raises(GlueError, match=r"^systemd-nspawn is missing: install the Debian package systemd-container"):
        preflight.check("qemu")

"""What `glue up` checks on this machine before creating anything: each backend's `check_host`, one
line naming the Debian package to install."""

from pathlib import Path

import pytest

from glue.cloud import get_backend
from glue.cloud.local import host, nspawn
from glue.errors import GlueError


def test_missing_nspawn_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_which = nspawn.shutil.which
    monkeypatch.setattr(nspawn.shutil, "which",
                        lambda n, path=None: None if n == "systemd-nspawn" else real_which(n, path=path))
    with pytest.raises(GlueError, match="systemd-container"):
        get_backend("local", tmp_path).check_host()


def test_missing_fuse_device_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host, "FUSE", Path("/nonexistent/fuse"))
    with pytest.raises(GlueError, match="fuse3"):
        get_backend("local", tmp_path).check_host()
    (line,) = get_backend("local", tmp_path).readiness().checks  # glue doctor says the same, as a ✗ line
    assert not line.ok and "fuse3" in line.detail


def test_qemu_needs_nspawn_for_the_boot_disks_docker_base(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from glue.images import docker_seed

    real_which = docker_seed.shutil.which
    monkeypatch.setattr(docker_seed.shutil, "which",
                        lambda n, path=None: None if n == "systemd-nspawn" else real_which(n, path=path))
    with pytest.raises(GlueError, match=r"^systemd-nspawn is missing: install the Debian package systemd-container"):
        get_backend("qemu", tmp_path).check_host()


def test_lyceum_needs_nothing_on_this_machine(tmp_path: Path) -> None:
    get_backend("lyceum", tmp_path).check_host()  # its VMs are Lyceum's; no key needed to say so

"""The qemu backend without booting: its command line touches only the host's loopback, a missing tool
or a GPU request is one line, and the seed it hands the first-boot unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from glue.cloud import BACKENDS, get_backend
from glue.cloud.base import VMSpec
from glue.cloud.qemu import vm
from glue.cloud.qemu.backend import QemuBackend
from glue.errors import GlueError
from glue.images.disk import BootDisk


def test_registered_and_gpu_less(tmp_path: Path) -> None:
    assert "qemu" in BACKENDS and isinstance(get_backend("qemu", tmp_path), QemuBackend)
    with pytest.raises(GlueError, match="the qemu backend has no GPUs"):
        QemuBackend(tmp_path).create_vm(VMSpec("q-1", "a100", 1, 10, "ssh-ed25519 AAAA"))


def test_missing_tool_names_its_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(vm.TOOLS, "gpukit-no-such-qemu", "qemu-system-x86")
    with pytest.raises(GlueError, match=r"^gpukit-no-such-qemu is missing: install the Debian package "
                                        r"qemu-system-x86 \(`make bootstrap` does\)$"):
        vm.check_tools()


def test_command_listens_and_connects_on_loopback_only() -> None:
    boot = BootDisk(disk=Path("/d.ext4"), kernel=Path("/k"), initrd=Path("/i"))
    cmd = vm.command("q-1", boot, Path("/o.qcow2"), Path("/s.img"), Path("/c.log"), 2222, 9000)
    netdev = cmd[cmd.index("-netdev") + 1]
    assert "restrict=on" in netdev.split(",")
    assert "hostfwd=tcp:127.0.0.1:2222-:22" in netdev.split(",")
    assert netdev.endswith("guestfwd=tcp:10.0.2.100:80-cmd:socat -t 5 - TCP:127.0.0.1:9000")
    assert "tcg,tb-size=256" in cmd and not any("kvm" in a for a in cmd)
    assert "-display" in cmd and "none" in cmd and not any(a.startswith(("-vnc", "-spice", "-monitor")) for a in cmd)
    assert cmd[cmd.index("-m") + 1] == "1024"


def test_seed_gives_identity_address_and_the_bucket_on_the_guests_loopback() -> None:
    lines = vm.meta_data("q-1", 9000).splitlines()
    assert lines == ["hostname=q-1", "ssh_listen=0.0.0.0:22", "address=10.0.2.15/24",
                     "bucket_listen=127.0.0.1:9000", "bucket_target=10.0.2.100:80"]

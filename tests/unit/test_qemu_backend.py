"""The qemu backend without booting: its command line touches only the host's loopback, a missing tool
or a GPU request is one line, and the seed it hands the first-boot unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glue.cloud import BACKENDS, get_backend
from glue.cloud.base import VMSpec
from glue.cloud.qemu import vm
from glue.cloud.qemu.backend import QemuBackend
from glue.errors import GlueError
from glue.images.disk import BootDisk
from glue.process import start_time


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


def _fake_vm(backend: QemuBackend, vm_id: str, pid: int, start: object) -> Path:
    """A VM directory as create_vm leaves it, its `qemu` being the given process."""
    vm_dir = backend.vms_dir / vm_id
    (vm_dir / "disk").mkdir(parents=True)
    (vm_dir / "disk" / "overlay.qcow2").write_bytes(b"")
    (vm_dir / "state.json").write_text(json.dumps({
        "id": vm_id, "name": vm_id.rsplit("-", 1)[0], "port": 2222, "host_key": "ssh-ed25519 AAAA",
        "unshare_pid": pid, "init_pid": pid, "init_start": start, "bucket_port": 9000, "disk": "/d.ext4"}))
    return vm_dir


def test_a_vm_whose_qemu_is_gone_reads_as_gone_and_its_disk_with_it(tmp_path: Path) -> None:
    # Drift as terraform sees it: a qemu killed out of band is a VM the cloud no longer has, disk and all
    # (`glue up` then creates a new one: tests/integration/test_cluster.py shows that path on local VMs).
    backend = QemuBackend(tmp_path)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        vm_dir = _fake_vm(backend, "q-1-aa", proc.pid, start_time(proc.pid))
        record = backend.read_vm("q-1-aa")
        assert record is not None and record.status == "running" and backend.qemu_pid("q-1-aa") == proc.pid
        proc.kill()
        proc.wait()
        assert backend.read_vm("q-1-aa") is None
        assert not vm_dir.exists() and backend.owned_vm_ids() == []
    finally:
        proc.kill()
        proc.wait()
    # A live process that is not the VM's qemu (its pid reused: another start time) is not the VM either.
    _fake_vm(backend, "q-2-bb", os.getpid(), "not this process's start")
    assert backend.read_vm("q-2-bb") is None and backend.owned_vm_ids() == []


def _on_disk(img: Path, request: str) -> bytes:
    return subprocess.run(["debugfs", "-R", request, str(img)], capture_output=True, check=True).stdout


def _listing(img: Path) -> dict[str, str]:
    """{name: mode} of the disk's root folder."""
    return {line.split()[-1]: line.split()[1] for line in _on_disk(img, "ls -l /").decode().splitlines()
            if line.strip()}


def test_the_configuration_seed_goes_on_the_seed_disk_root_only(tmp_path: Path) -> None:
    """User-data, as clouds pass it: the cluster's configuration seed (it holds the bucket credentials) on
    the VM's seed disk, where the first-boot unit finds it; the disk and the files on it root-only."""
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "current.tar.gz").write_bytes(b"\x1f\x8b config with credentials")
    (seeds / "current.key").write_text("0123456789abcdef\n")
    img = tmp_path / "seed.img"
    vm.write_seed_disk(img, "hostname=q-1\n", "ssh-ed25519 AAAA", seeds / "current.tar.gz")
    assert img.stat().st_mode & 0o777 == 0o600
    listing = _listing(img)
    assert listing["config.tar.gz"] == listing["config.key"] == "100600", listing
    assert listing["meta-data"] == "100644"
    assert _on_disk(img, "cat /config.key") == b"0123456789abcdef\n"
    assert _on_disk(img, "cat /config.tar.gz") == b"\x1f\x8b config with credentials"


def test_without_a_captured_seed_the_disk_has_identity_only(tmp_path: Path) -> None:
    img = tmp_path / "seed.img"
    vm.write_seed_disk(img, "hostname=q-1\n", "ssh-ed25519 AAAA", tmp_path / "seeds" / "current.tar.gz")
    names = set(_listing(img))
    assert {"meta-data", "authorized_keys"} <= names and not {"config.tar.gz", "config.key"} & names


def _guest(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_boot_is_budgeted_in_the_emulators_cpu_time_not_the_wall(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest that waits for a core (no CPU used) is not failed by the CPU budget; one that spins through
    its budget without a host key is, and the message says it was the CPU time."""
    console, log = tmp_path / "console.log", tmp_path / "qemu.log"
    console.write_text("booting\n")
    log.write_text("")
    monkeypatch.setattr(vm, "BOOT_CPU_SECONDS", 0.5)
    monkeypatch.setattr(vm, "BOOT_WALL_LIMIT", 60.0)
    spinning = _guest("while True: pass")
    try:
        with pytest.raises(GlueError, match=r"no host key on its serial console \(first boot failed\) after "
                                            r"\d+ CPU-seconds of emulation; its console's last lines: booting"):
            vm.wait_booted("q-1", spinning, console, 1, log)
    finally:
        spinning.kill()
        spinning.wait()
    monkeypatch.setattr(vm, "BOOT_WALL_LIMIT", 1.5)
    waiting = _guest("import time; time.sleep(60)")
    try:
        with pytest.raises(GlueError, match=r"first boot failed\) after 2s; its console's last lines: booting"):
            vm.wait_booted("q-1", waiting, console, 1, log)
        console.write_text("[    3.1] Kernel panic - not syncing: VFS: Unable to mount root fs\n")
        monkeypatch.setattr(vm, "BOOT_WALL_LIMIT", 60.0)
        with pytest.raises(GlueError, match=r"its first boot failed: .*Kernel panic - not syncing"):
            vm.wait_booted("q-1", waiting, console, 1, log)
    finally:
        waiting.kill()
        waiting.wait()

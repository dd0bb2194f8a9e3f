"""A configuration seed dropped while nothing changed (bench/recovery.py's `vm_seed.forget`, then a recovery
by the playbook, which takes none) is taken again by the next `glue up` that finds nothing to converge, from
a VM the playbook configured, never from one that applied a seed at first boot. SSH is faked: each VM
answers `capture`'s script as the real one would (exit 3 where /var/lib/gpukit/configured-from exists)."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.infra import inventory, ssh
from glue.operations import converge, convergence, lifecycle, vm_seed

SHARED = {"roles": "r1", "group vars": "", "code": "c1", "image": "i1", "bucket": "b1", "credentials": "k1"}


def _host(name: str) -> inventory.Host:
    return inventory.Host(name=name, id=f"{name}-id", ssh_host="127.0.0.1", ssh_port=1, ssh_user="root",
                          host_key="", gpu_type="none", gpu_count=0, backend="local")


def _tar_of(name: str) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = f"written by the playbook on {name}\n".encode()
        info = tarfile.TarInfo("etc/gpukit/mount.conf")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


class FakeVMs:
    """ssh.run for VMs of which `seeded` applied a seed at first boot; records who was asked."""

    def __init__(self, seeded: set[str]) -> None:
        self.seeded = seeded
        self.asked: list[str] = []

    def run(self, home: Path, host: inventory.Host, command: str, timeout: float = 600,
            stream: bool = False) -> ssh.CommandResult:
        assert vm_seed.CONFIGURED_FROM in command and vm_seed.FIRST_BOOT_MARK in command  # capture's script
        self.asked.append(host.name)
        if host.name in self.seeded:
            return ssh.CommandResult(exit_code=3, stdout="", stderr="")
        return ssh.CommandResult(exit_code=0, stdout=_tar_of(host.name), stderr="")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[inventory.Host]]:
    """Three local VMs converged at the same parts; `glue up` finds nothing to converge on them."""
    ClusterConfig(backend="local", vms=3).save(tmp_path)
    hosts = [_host(f"gpukit-{i}") for i in (1, 2, 3)]
    parts = {h.name: convergence.VMParts(h.id, {**SHARED, "inventory entry": h.name}) for h in hosts}
    monkeypatch.setattr(convergence, "vm_parts", lambda home, image: parts)
    monkeypatch.setattr(converge, "stale", lambda home, vms, now: {})
    return tmp_path, hosts


def _up(home: Path, hosts: list[inventory.Host], fake: FakeVMs, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(ssh, "run", fake.run)
    out = io.StringIO()
    lifecycle.converge_changed(home, Console(file=out, width=300), hosts, None)
    return " ".join(out.getvalue().split())


def test_a_dropped_seed_is_taken_again_from_a_vm_the_playbook_configured(
        cluster: tuple[Path, list[inventory.Host]], monkeypatch: pytest.MonkeyPatch) -> None:
    home, hosts = cluster
    fake = FakeVMs(seeded={"gpukit-1"})  # gpukit-1 applied an older seed: never captured from
    said = _up(home, hosts, fake, monkeypatch)
    assert "configuration: nothing changed on 3 VM(s)" in said
    key = vm_seed.key_of(convergence.vm_parts(home, None)["gpukit-2"])
    assert f"configuration seed {key} captured from gpukit-2" in said, said
    assert fake.asked == ["gpukit-1", "gpukit-2"]
    assert vm_seed.current_key(home) == key
    with tarfile.open(vm_seed.seed_path(home)) as tar:
        member = tar.extractfile("etc/gpukit/mount.conf")
        assert member is not None and member.read() == b"written by the playbook on gpukit-2\n"

    # Taken: the next `glue up` with nothing to converge asks no VM for it again.
    again = FakeVMs(seeded=set())
    said = _up(home, hosts, again, monkeypatch)
    assert again.asked == [] and "captured" not in said


def test_no_seed_when_every_vm_applied_one_at_first_boot(
        cluster: tuple[Path, list[inventory.Host]], monkeypatch: pytest.MonkeyPatch) -> None:
    home, hosts = cluster
    fake = FakeVMs(seeded={h.name for h in hosts})
    said = _up(home, hosts, fake, monkeypatch)
    assert fake.asked == ["gpukit-1", "gpukit-2", "gpukit-3"]
    assert "no configuration seed: gpukit-1, gpukit-2, gpukit-3 had applied a seed at first boot" in said, said
    assert vm_seed.current_key(home) is None and not vm_seed.seed_path(home).exists()


def test_a_backend_without_seeds_is_never_asked(
        cluster: tuple[Path, list[inventory.Host]], monkeypatch: pytest.MonkeyPatch) -> None:
    home, hosts = cluster
    from glue.cloud.local.backend import LocalBackend

    monkeypatch.setattr(LocalBackend, "takes_config_seed", False)

    def no_ssh(*args: object, **kwargs: object) -> ssh.CommandResult:
        raise GlueError("no VM is asked for a seed on a backend that takes none")

    monkeypatch.setattr(ssh, "run", no_ssh)
    out = io.StringIO()
    lifecycle.converge_changed(home, Console(file=out, width=300), hosts, None)
    assert vm_seed.current_key(home) is None and "seed" not in out.getvalue()

"""Local VMs booted from the baked gpukit image (systemd-nspawn machines): a real init, their own root
filesystem, nothing of the controller's visible, their own pinned host key, a killed VM gone with its
disk and cgroups, and (make test-all) replaced by `glue up` with an empty disk. Real mmdebstrap image,
real nspawn, real sshd, real Ansible."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import paramiko
import pytest

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.infra.ssh_keys import public_key
from tests.integration.test_runs import run_config, status, wait_for
from tests.kit import Kit, vm_ssh

pytestmark = pytest.mark.integration

MARKER_ENV = "GPUKIT_TEST_CONTROLLER_MARKER"


@pytest.fixture
def machines(kit: Kit, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(MARKER_ENV, "controller-secret-marker")
    backend = LocalBackend(kit.home)
    public = public_key(kit.home)
    created: list[str] = []

    def create(name: str) -> VMRecord:
        vm = backend.create_vm(VMSpec(name=name, gpu_type="none", gpu_count=0, disk_gb=10, ssh_public_key=public))
        created.append(vm.id)
        return vm

    yield backend, create
    for vm_id in created:
        backend.delete_vm(vm_id)


def test_machine_boots_systemd_isolated_with_its_own_host_key(kit: Kit, machines) -> None:
    _backend, create = machines
    (kit.home / "marker-in-kit-home").write_text("secret")
    a, b = create("m-1"), create("m-2")
    assert a.host_key != b.host_key and a.host_key.startswith("ssh-ed25519 ")

    rc, out = vm_ssh(kit.home, a, "cat /proc/1/comm; systemctl is-system-running --wait; "
                               "systemctl --failed --no-legend | wc -l; hostname; test -c /dev/fuse && echo fuse")
    assert rc == 0, out
    comm, running, failed, hostname, fuse = out.split()[:5]
    assert (comm, running, failed, hostname, fuse) == ("systemd", "running", "0", "m-1", "fuse")

    # Nothing of the controller: not its files (kit home: keys, bucket credentials), not its environment.
    rc, out = vm_ssh(kit.home, a, f"ls {kit.home} 2>&1; find / -xdev -name marker-in-kit-home 2>/dev/null; "
                               f"cat /proc/1/environ | tr '\\0' '\\n'; env; "
                               f"grep -rl controller-secret-marker /proc/[0-9]*/environ 2>/dev/null")
    assert "No such file or directory" in out, out
    assert "marker-in-kit-home" not in out.replace(str(kit.home), "")
    assert "controller-secret-marker" not in out and MARKER_ENV not in out
    # Its own root filesystem: the image's, not the host's.
    rc, out = vm_ssh(kit.home, a, "test -x /opt/gpukit/venv/bin/python && test -x /usr/local/bin/rclone && "
                               f"test ! -e {Path(__file__).resolve().parents[2]} && echo image-root")
    assert out.strip() == "image-root", out

    # The pinned key is the one sshd serves: a different one is refused.
    forged = VMRecord(**{**a.as_dict(), "host_key": b.host_key})
    with pytest.raises(paramiko.SSHException):
        vm_ssh(kit.home, forged, "true")


def test_killed_machine_reads_as_gone_and_its_disk_with_it(kit: Kit, machines) -> None:
    backend, create = machines
    vm = create("k-1")
    rc, _ = vm_ssh(kit.home, vm, "echo data > /root/on-the-vm-disk")
    assert rc == 0
    state = json.loads((backend.vms_dir / vm.id / "state.json").read_text())
    os.kill(int(state["init_pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while backend.read_vm(vm.id) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.read_vm(vm.id) is None
    assert not (backend.vms_dir / vm.id).exists()
    assert state["cgroups"] and not any(Path(p).exists() for p in state["cgroups"])  # gone with the VM


# `stress` (make test-all): make test has `glue up` verifying sized VMs with the mount through its unit
# (tests/integration/test_up_converge.py), `deploy --memory-limit-mb` OOM-killed inside a machine
# (tests/integration/test_runs.py::test_memory_limit_overrun_is_host_oom), a killed machine replaced by `glue up`
# with an empty disk (tests/integration/test_cluster.py::test_up_ssh_isolation_replace_down) and its cgroups
# removed (test_killed_machine_reads_as_gone_and_its_disk_with_it above); this joins them on one VM.
@pytest.mark.stress
def test_glue_up_mounts_through_the_unit_and_replaces_a_killed_machine_with_an_empty_disk(kit: Kit,
                                                                                           tmp_path: Path) -> None:
    env = {**kit.env, "GPUKIT_VM_MEMORY_GB": "2", "GPUKIT_VM_CPUS": "1"}
    kit.glue("up", "--vms", "1", env=env, timeout=600)
    # The same run of Ansible verified the VM (up.yml): its summary is what `glue status` shows.
    (vm,) = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
    assert vm["verify"]["ready"] is True and vm["verify"]["mount"]["round_trip"] is True, vm
    on_vm = ("systemctl is-active gpukit-mount.service mnt-s3.mount; findmnt -n -o FSTYPE /mnt/s3; "
             "cat /proc/1/comm; systemctl is-system-running")
    out = kit.glue("ssh", "gpukit-1", "sh", "-c", on_vm, env=env).stdout.split()
    assert out == ["active", "active", "fuse.rclone", "systemd", "running"], out
    kit.glue("ssh", "gpukit-1", "sh", "-c", "echo lost > /root/on-the-old-disk", env=env)

    backend = LocalBackend(kit.home)
    (old_id,) = backend.owned_vm_ids()
    state = json.loads((backend.vms_dir / old_id / "state.json").read_text())
    # The VM's size is its cgroup's limits; the VM sees its own memory limit.
    limits = {Path(p).parts[4]: Path(p) for p in state["cgroups"]}  # /sys/fs/cgroup/<controller>/gpukit/<id>
    if "memory" in limits:  # cgroup v1 (as here)
        assert (limits["memory"] / "memory.limit_in_bytes").read_text().strip() == str(2 * 2**30)
        assert (limits["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "100000"
        seen = kit.glue("ssh", "gpukit-1", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes", env=env).stdout
        assert seen.strip() == str(2 * 2**30)
    # `deploy --memory-limit-mb` works inside the machine: the trainer's own cgroup, an overrun is an OOM kill.
    cfg = run_config(tmp_path, config={"steps": 5, "d_model": 512, "n_layer": 4, "batch_size": 64, "seq_len": 64})
    kit.glue("deploy", "--run", "oom-machine", "--config", str(cfg), "--memory-limit-mb", "350", env=env)
    mkit = Kit(home=kit.home, env=env)
    wait_for(mkit, "oom-machine", lambda s: s["state"] != "running", timeout=180)
    assert status(mkit, "oom-machine")["state"] == "oom_host"
    os.kill(int(state["init_pid"]), signal.SIGKILL)  # the VM dies out of band: drift for terraform

    kit.glue("up", env=env, timeout=600)
    (new_id,) = backend.owned_vm_ids()
    assert new_id != old_id
    assert state["cgroups"] and not any(Path(p).exists() for p in state["cgroups"])  # gone with the VM
    out = kit.glue("ssh", "gpukit-1", "sh", "-c", "test -e /root/on-the-old-disk && echo old-disk || echo empty-disk; "
                   "systemctl is-active gpukit-mount.service", env=env).stdout.split()
    assert out == ["empty-disk", "active"], out


def test_a_taken_ssh_port_fails_the_boot_in_one_line_and_leaves_nothing(kit: Kit, machines,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process took the VM's port between the pick and the boot: one line naming the port, and
    the half-booted VM (its disk, its cgroups, its processes) is gone."""
    from glue.cloud.local import backend as backend_mod
    from glue.cloud.local import nspawn
    from glue.errors import GlueError

    backend, create = machines
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    monkeypatch.setattr(backend_mod, "free_port", lambda: port)
    monkeypatch.setattr(nspawn, "BOOT_TIMEOUT", 15.0)
    try:
        with pytest.raises(GlueError, match=f"127.0.0.1:{port}.*port taken"):
            create("p-1")
    finally:
        squatter.close()
    assert backend.owned_vm_ids() == []
    assert not list(Path("/sys/fs/cgroup").glob("*/gpukit/p-1-*")), "the failed VM's cgroups are left"


def test_a_first_boot_that_fails_is_said_at_once_with_what_the_console_said(machines,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed without its meta-data: the image's first-boot unit fails and says why on the console; the
    boot's wait ends there (not at its time limit) with that line, and nothing of the VM is left."""
    from glue.cloud.local import nspawn
    from glue.errors import GlueError

    backend, create = machines

    def no_meta_data(seed: Path, *_: object) -> None:
        seed.mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(nspawn, "write_seed", no_meta_data)
    with pytest.raises(GlueError, match=r"local VM f-1: its first boot failed: .*gpukit-firstboot: no seed found"):
        create("f-1")
    assert backend.owned_vm_ids() == []

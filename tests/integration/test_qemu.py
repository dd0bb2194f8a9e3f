"""qemu VMs: the baked gpukit image booted with its own kernel (TCG), made by the real
`glue up --backend qemu` (terraform, the gpukit provider) and configured by the real roles
(nvidia_driver's no-GPU path, container_runtime, bucket_mount): /mnt/s3 mounted by its systemd unit
through the guest's loopback forwarder to the host's bucket, Docker running, a second converge
changes nothing, the nvidia_driver role's reboot brings the mount back, a killed qemu reads as gone
and the next `glue up` replaces it with an empty disk; `glue down` removes it.

The trainer role (a pip install and a real `import torch` under emulation) is left to `glue up`
without --no-configure and bench/qemu.py: it would triple this test's time on a busy host."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from glue.cloud.qemu.backend import QemuBackend
from glue.infra import ansible_run
from glue.infra.ansible_run import ANSIBLE_DIR
from tests.kit import Kit

pytestmark = pytest.mark.integration

# site.yml's system roles, gathered as site.yml gathers.
CONVERGE_PLAY = """\
- name: Configure the qemu VM
  hosts: all
  gather_facts: true
  gather_subset: ["!all", "!min", distribution, platform, service_mgr, local]
  roles:
    - nvidia_driver
    - container_runtime
    - bucket_mount
"""
REBOOT_PLAY = """\
- name: Reboot through the nvidia_driver role's reboot (as after a driver change)
  hosts: all
  gather_facts: false
  tasks:
    - name: Reboot
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: reboot.yml
      vars:
        nvidia_driver_reboot_timeout: 600
"""


def _on_vm(kit: Kit, script: str) -> list[str]:
    return kit.glue("ssh", "gpukit-1", "sh", "-c", script, timeout=180).stdout.split()


def reboot_and_check_mount(kit: Kit, tmp_path: Path, boot_id: str) -> None:
    """The nvidia_driver role's reboot; the VM comes back (a new boot id) with /mnt/s3 mounted by its unit.
    Leaves a file on the VM's disk for the replacement's empty-disk check."""
    (tmp_path / "reboot.yml").write_text(REBOOT_PLAY)
    if not (tmp_path / "group_vars").exists():
        (tmp_path / "group_vars").symlink_to(ANSIBLE_DIR / "group_vars")  # the pinned host keys
    rebooted = ansible_run.run_playbook(str(tmp_path / "reboot.yml"), kit.home, progress=False)
    assert rebooted.ok, rebooted
    after = _on_vm(kit, "systemctl is-system-running --wait >/dev/null; "
                        "systemctl is-active gpukit-mount.service; findmnt -n -o FSTYPE /mnt/s3; "
                        "cat /proc/sys/kernel/random/boot_id; echo lost > /root/on-the-old-disk")
    assert after[:2] == ["active", "fuse.rclone"] and after[2] != boot_id, after


@pytest.mark.timeout(1800)  # ~3 min on an idle 2-core host; emulation slows down many times on a busy one
def test_qemu_vm_up_mount_docker_reboot_kill_replace_down(qemu_kit: Kit, tmp_path: Path) -> None:
    kit = qemu_kit
    kit.glue("up", "--backend", "qemu", "--vms", "1", "--no-configure", timeout=900)
    backend = QemuBackend(kit.home)
    (vm_id,) = backend.owned_vm_ids()
    (tmp_path / "converge.yml").write_text(CONVERGE_PLAY)
    (tmp_path / "group_vars").symlink_to(ANSIBLE_DIR / "group_vars")  # the pinned host keys, as for site.yml
    first = ansible_run.run_playbook(str(tmp_path / "converge.yml"), kit.home, progress=False)
    assert first.ok and first.changed["gpukit-1"] > 0, first

    checks = ("systemctl is-active gpukit-mount.service docker.service; findmnt -n -o FSTYPE /mnt/s3; "
              "cat /proc/1/comm; uname -r | grep -c cloud-amd64; cat /proc/sys/kernel/random/boot_id")
    active_mount, active_docker, fstype, init, own_kernel, boot_id = _on_vm(kit, checks)
    assert (active_mount, active_docker, fstype, init, own_kernel) == ("active", "active", "fuse.rclone",
                                                                       "systemd", "1")

    again = ansible_run.run_playbook(str(tmp_path / "converge.yml"), kit.home, progress=False)
    assert again.ok and again.changed == {"gpukit-1": 0}, again

    reboot_and_check_mount(kit, tmp_path, boot_id)

    pid = backend.qemu_pid(vm_id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the VM dies out of band: drift for terraform
    deadline = time.monotonic() + 10
    while backend.read_vm(vm_id) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.read_vm(vm_id) is None and backend.owned_vm_ids() == []

    kit.glue("up", "--no-configure", timeout=600)
    (new_id,) = backend.owned_vm_ids()
    assert new_id != vm_id
    assert _on_vm(kit, "test -e /root/on-the-old-disk && echo old-disk || echo empty-disk") == ["empty-disk"]

    kit.glue("down", timeout=300)
    assert backend.owned_vm_ids() == []

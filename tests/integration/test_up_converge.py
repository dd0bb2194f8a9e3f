"""`glue up` does only what changed: with nothing changed it applies and converges nothing (it checks each
VM answers with its mount live); a changed role variable converges every VM; a VM whose mount stopped is
converged alone; each converged VM is named with the reason. The VMs are sized (GPUKIT_VM_MEMORY_GB,
GPUKIT_VM_CPUS: their cgroup's limits), and the first up verified them with the mount through its unit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.infra.ansible_run import runner_dir
from tests.kit import Kit

pytestmark = pytest.mark.integration


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join(proc.stderr.split())  # rich wraps long lines


def _serial(kit: Kit) -> int:
    return int(json.loads((kit.home / "terraform" / "local" / "terraform.tfstate").read_text())["serial"])


def _playbook_runs(kit: Kit) -> int:
    artifacts = runner_dir(kit.home) / "artifacts"
    return len(list(artifacts.iterdir())) if artifacts.is_dir() else 0


def _mount_conf(kit: Kit, vm: str) -> str:
    return kit.glue("ssh", vm, "cat", "/etc/gpukit/mount.conf").stdout


def _sized_verified_and_mounted_by_the_unit(kit: Kit) -> None:
    """The same run of Ansible verified the VMs (up.yml): its summary is what `glue status` shows; /mnt/s3 is
    the systemd unit's mount; each VM's size is its cgroup's limits, and the VM sees its own memory limit."""
    vms = json.loads(kit.glue("status", "--json").stdout)["vms"]
    assert len(vms) == 2 and all(vm["verify"]["ready"] is True and vm["verify"]["mount"]["round_trip"] is True
                                 for vm in vms), vms
    on_vm = ("systemctl is-active gpukit-mount.service mnt-s3.mount; findmnt -n -o FSTYPE /mnt/s3; "
             "cat /proc/1/comm; systemctl is-system-running")
    out = kit.glue("ssh", "gpukit-1", "sh", "-c", on_vm).stdout.split()
    assert out == ["active", "active", "fuse.rclone", "systemd", "running"], out
    backend = LocalBackend(kit.home)
    v1 = False
    for vm_id in backend.owned_vm_ids():
        state = json.loads((backend.vms_dir / vm_id / "state.json").read_text())
        limits = {Path(p).parts[4]: Path(p) for p in state["cgroups"]}  # /sys/fs/cgroup/<controller>/gpukit/<id>
        if v1 := "memory" in limits:  # cgroup v1 (as here)
            assert (limits["memory"] / "memory.limit_in_bytes").read_text().strip() == str(2 * 2**30)
            assert (limits["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "100000"
    if v1:
        seen = kit.glue("ssh", "gpukit-1", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes").stdout
        assert seen.strip() == str(2 * 2**30)


@pytest.mark.timeout(600)
def test_up_converges_only_what_changed_and_says_why(kit: Kit) -> None:
    # Sized VMs, as a user sizes them; every `glue up` below with the same sizes (another would replace them).
    kit = Kit(home=kit.home, env={**kit.env, "GPUKIT_VM_MEMORY_GB": "2", "GPUKIT_VM_CPUS": "1"})
    first = _said(kit.glue("up", "--vms", "2", timeout=600))
    assert "converging gpukit-1: never configured" in first and "converging gpukit-2: never configured" in first
    _sized_verified_and_mounted_by_the_unit(kit)
    serial, runs = _serial(kit), _playbook_runs(kit)

    same = _said(kit.glue("up"))
    assert "terraform: nothing to change (2 VM(s) up)" in same, same
    assert "configuration: nothing changed on 2 VM(s)" in same and "converging" not in same, same
    assert (_serial(kit), _playbook_runs(kit)) == (serial, runs)  # no apply, no playbook

    # A VM whose mount stopped (out of band): converged alone, the mount back.
    kit.glue("ssh", "gpukit-2", "--", "systemctl", "stop", "gpukit-mount.service")
    fixed = _said(kit.glue("up"))
    assert "converging gpukit-2: its bucket mount is not active" in fixed and "gpukit-1:" not in fixed, fixed
    assert kit.glue("ssh", "gpukit-2", "systemctl", "is-active", "gpukit-mount.service").stdout.strip() == "active"
    assert _serial(kit) == serial

    # A role variable the user sets beside the inventory: every VM converges with it.
    group_vars = kit.home / "ansible" / "group_vars"
    group_vars.mkdir(parents=True, exist_ok=True)
    (group_vars / "all.yml").write_text("bucket_mount_vfs_cache_max_age: 2h\n")
    changed = _said(kit.glue("up"))
    for vm in ("gpukit-1", "gpukit-2"):
        assert f"converging {vm}: group vars changed" in changed, changed
        assert "VFS_CACHE_MAX_AGE=2h" in _mount_conf(kit, vm)
    assert "nothing changed on 2 VM(s)" in _said(kit.glue("up"))

    bad = kit.glue("up", "--converge", "--no-configure", check=False)
    assert bad.returncode == 2 and "contradict" in bad.stderr and "Traceback" not in bad.stderr

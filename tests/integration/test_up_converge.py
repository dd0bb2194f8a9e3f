"""`glue up` does only what changed: with nothing changed it applies and converges nothing (it checks each
VM answers with its mount live); a changed role variable converges every VM; a VM whose mount stopped is
converged alone; each converged VM is named with the reason."""

from __future__ import annotations

import json
import subprocess

import pytest

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


@pytest.mark.timeout(600)
def test_up_converges_only_what_changed_and_says_why(kit: Kit) -> None:
    first = _said(kit.glue("up", "--vms", "2", timeout=600))
    assert "converging gpukit-1: never configured" in first and "converging gpukit-2: never configured" in first
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

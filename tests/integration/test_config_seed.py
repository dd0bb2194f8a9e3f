"""A VM of the baked image configures itself at first boot from the cluster's configuration seed (user-data
the provider hands over), so a re-created VM needs no playbook; a changed configuration makes every VM
converge again. The seeded VM is what the playbook makes: a playbook run on it changes nothing."""

from __future__ import annotations

import json
import stat
import tarfile
from typing import Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.infra import ansible_run
from glue.operations import convergence, vm_seed
from tests.kit import Kit

# `stress` (make test-all): make test recovers a run onto a new VM that configured itself from the seed and
# checks its resume (tests/e2e/test_own_job.py::test_own_project_recovers_from_the_bucket_after_the_local_copy_is_gone);
# this test compares the seeded VM with the playbook's and drops a stale seed.
pytestmark = [pytest.mark.integration, pytest.mark.stress]


def _vm(kit: Kit, name: str) -> dict[str, Any]:
    return next(v for v in json.loads(kit.glue("status", "--json").stdout)["vms"] if v["name"] == name)


@pytest.mark.timeout(900)
def test_a_recreated_vm_configures_itself_from_the_seed_as_the_playbook_would(kit: Kit) -> None:
    said = " ".join(kit.glue("up", "--vms", "2", timeout=600).stderr.split())
    assert "converging gpukit-1: never configured" in said and "configuration seed" in said
    seed = vm_seed.seed_path(kit.home)
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600  # it holds the bucket credentials
    secret = LocalBucket(kit.home).credentials().secret_key
    state = (kit.home / "terraform" / "local" / "terraform.tfstate").read_text()
    assert str(seed) in state and secret not in state  # terraform carries the path, never the contents

    # A lost VM re-created by `glue up`: no playbook for it, its mount is live, recorded as converged.
    LocalBackend(kit.home).delete_vm(_vm(kit, "gpukit-2")["id"])
    said = " ".join(kit.glue("up").stderr.split())
    assert "gpukit-2: configured itself at first boot from the cluster's seed" in said, said
    assert "converging gpukit-2" not in said
    assert "converging gpukit-1" not in said  # local VMs' group firewall is off: the VM list is not in its config
    new_id = _vm(kit, "gpukit-2")["id"]
    assert convergence.converged_at(kit.home, new_id) is not None
    assert _vm(kit, "gpukit-2")["verify"]["ready"]  # verify.yml ran on it instead of the playbook
    out = kit.glue("ssh", "gpukit-2", "--", "sh", "-c",
                   "findmnt -n -o FSTYPE /mnt/s3; cat /var/lib/gpukit/configured-from")
    assert out.stdout.split() == ["fuse.rclone", vm_seed.current_key(kit.home)]
    # What the seed made is what the playbook makes: the playbook finds nothing to change on it.
    again = ansible_run.converge(kit.home, limit=["gpukit-2"], progress=False)
    assert again.ok and again.changed == {"gpukit-2": 0}, again

    # A seed dropped while nothing changed (bench/recovery.py drops it to measure the playbook path) is taken
    # again by the next `glue up`, which converges nothing: from gpukit-1, which the playbook configured.
    key = vm_seed.current_key(kit.home)
    vm_seed.forget(kit.home)
    said = " ".join(kit.glue("up").stderr.split())
    assert "configuration: nothing changed" in said and f"configuration seed {key} captured from gpukit-1" in said, said
    assert vm_seed.current_key(kit.home) == key

    # A changed role variable: the seed is stale, the next up converges every VM, and a VM created after
    # it is converged by the playbook too (it never boots the old configuration unconverged).
    group_vars = convergence.user_group_vars(kit.home)
    group_vars.mkdir(parents=True, exist_ok=True)
    (group_vars / "all.yml").write_text("bucket_mount_vfs_write_back: 2s\n")
    LocalBackend(kit.home).delete_vm(new_id)
    said = " ".join(kit.glue("up").stderr.split())
    assert "converging gpukit-1: group vars" in said, said
    assert "converging gpukit-2: never configured" in said and "configured itself" not in said
    assert "configuration seed" in said  # taken again, for the new configuration

    # After `glue down` there is no inventory, yet a changed configuration still drops the seed before
    # the VMs are made: they boot without it, the playbook converges them, and the seed taken from them
    # holds everything it wrote (not only what differs from an older seed's copies).
    kit.glue("down")
    (group_vars / "all.yml").write_text("bucket_mount_vfs_write_back: 3s\n")
    said = " ".join(kit.glue("up").stderr.split())
    assert "converging gpukit-1: never configured" in said and "configured itself" not in said, said
    assert "configuration seed" in said and "no configuration seed" not in said, said
    with tarfile.open(seed) as tar:
        names = set(tar.getnames())
    assert {"etc/gpukit/mount.conf", "etc/gpukit/rclone.conf", "usr/local/sbin/gpukit-mount"} <= names, names
    kit.glue("down")

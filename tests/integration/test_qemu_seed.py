"""A qemu VM configures itself from the cluster's configuration seed as a local machine does, the seed on
its seed disk (user-data): the second VM of a cluster needs no playbook, its mount and Docker run as the
playbook left them on the first, and the playbook finds nothing to change on it. Minutes of emulation
(two boots, a converge): a `stress` test (`make test-all`); tests/unit/test_qemu_backend.py shows the seed
disk's content without a boot, and the qemu e2e that a trainer in a Docker image is never seeded."""

from __future__ import annotations

import json
import stat

import pytest

from glue.cloud.qemu.backend import QemuBackend
from glue.infra import ansible_run
from glue.operations import convergence, vm_seed
from tests.kit import Kit

pytestmark = [pytest.mark.integration, pytest.mark.stress]


@pytest.mark.timeout(3600)
def test_a_qemu_vm_from_the_seed_is_what_the_playbook_makes(qemu_kit: Kit) -> None:
    kit = qemu_kit
    said = " ".join(kit.glue("up", "--backend", "qemu", "--vms", "1", timeout=1800).stderr.split())
    assert "converging gpukit-1: never configured" in said and "captured from gpukit-1" in said, said

    said = " ".join(kit.glue("up", "--vms", "2", timeout=1800).stderr.split())
    assert "gpukit-2: configured itself at first boot from the cluster's seed" in said, said
    assert "converging gpukit-2" not in said and "converging gpukit-1" not in said, said
    vms = {v["name"]: v for v in json.loads(kit.glue("status", "--json").stdout)["vms"]}
    assert vms["gpukit-2"]["verify"]["ready"], vms  # verify.yml ran on it instead of the playbook
    assert convergence.converged_at(kit.home, vms["gpukit-2"]["id"]) is not None
    seed_disk = QemuBackend(kit.home).vms_dir / vms["gpukit-2"]["id"] / "seed.img"
    assert stat.S_IMODE(seed_disk.stat().st_mode) == 0o600  # it carries the bucket credentials
    out = kit.glue("ssh", "gpukit-2", "--", "sh", "-c",
                   "findmnt -n -o FSTYPE /mnt/s3; cat /var/lib/gpukit/configured-from; "
                   "systemctl is-active docker.service", timeout=180)
    assert out.stdout.split() == ["fuse.rclone", vm_seed.current_key(kit.home), "active"], out.stdout
    # What the seed made is what the playbook makes.
    again = ansible_run.converge(kit.home, limit=["gpukit-2"], progress=False)
    assert again.ok and again.changed == {"gpukit-2": 0}, again
    kit.glue("down", timeout=300)
    assert QemuBackend(kit.home).owned_vm_ids() == []


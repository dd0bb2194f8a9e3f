"""Local VMs + the local bucket + an inventory, without Terraform: for the Ansible tests and
bench/converge.py.

`glue up` reaches the same state through Terraform (whose outputs feed `inventory.write`); this
skips Terraform so a test measures and exercises only the Ansible side. The outputs it hands to
`inventory.write` are built by `inventory.outputs_of`, the same contract Terraform's outputs follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketInfo
from glue.cloud import get_backend
from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.infra import inventory
from glue.infra.ssh_keys import public_key


@dataclass
class LocalTestbed:
    """VMs named <prefix>-1..N in `home`, the bucket running, inventory + known_hosts written."""

    home: Path
    prefix: str = "gpukit"
    vms: dict[str, VMRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        # The local backend (VMs booted from the baked image).
        backend = get_backend("local", self.home)
        assert isinstance(backend, LocalBackend)
        self.backend = backend

    @property
    def bucket(self) -> BucketInfo:
        return self.backend.bucket()

    def outputs(self) -> dict[str, Any]:
        """What Terraform's `vms` and `bucket` outputs would be for these VMs."""
        return inventory.outputs_of(self.vms, self.bucket)

    def write_inventory(self) -> None:
        inventory.write(self.home, self.outputs())

    def create(self, count: int) -> list[str]:
        """Create `count` more VMs; returns their names."""
        self.backend.bucket()
        self.backend.bucket_credentials()
        key = public_key(self.home)
        names = []
        for i in range(len(self.vms) + 1, len(self.vms) + count + 1):
            name = f"{self.prefix}-{i}"
            self.vms[name] = self.backend.create_vm(VMSpec(name, "none", 0, 10, key))
            names.append(name)
        self.write_inventory()
        return names

    def replace(self, name: str) -> VMRecord:
        """Delete VM `name` and create a fresh one under the same name (new disk, new host key)."""
        old = self.vms[name]
        self.backend.delete_vm(old.id)
        self.vms[name] = self.backend.create_vm(VMSpec(name, "none", 0, 10, public_key(self.home)))
        self.write_inventory()
        return self.vms[name]

    def destroy(self) -> None:
        for rec in self.vms.values():
            self.backend.delete_vm(rec.id)
        self.vms.clear()
        self.write_inventory()

    def stop_bucket(self) -> None:
        self.backend.bucket_server.stop()

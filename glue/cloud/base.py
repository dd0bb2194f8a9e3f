"""The one small interface every backend implements, and the VM records at its boundary. The bucket
records live in glue.bucket_access: storage uses them too, and must not depend on the cloud layer."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.checks import Readiness
from glue.errors import GlueError

SPARE_MARK = "-spare-"  # a warm spare is named <prefix>-spare-<k> (terraform/modules/cluster)


@dataclass(frozen=True)
class VMSpec:
    """What the user asks for (the gpukit_vm resource's inputs)."""

    name: str
    gpu_type: str
    gpu_count: int
    disk_gb: int
    ssh_public_key: str
    # User-data: a file of the cluster's configuration the VM applies at first boot (a path in the kit
    # home, root-only; its contents never pass through terraform). None, or missing: none.
    config_seed: str | None = None


@dataclass(frozen=True)
class VMRecord:
    """What a backend reports about a VM (the gpukit_vm resource's computed attributes)."""

    id: str
    name: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    host_key: str
    gpu_type: str
    gpu_count: int
    backend: str
    status: str
    # The capacity pool: "spot" (reclaimable without notice), "on-demand"; "" where a backend has none.
    market: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["SPARE_MARK", "AnnouncesTermination", "Backend", "BucketCredentials", "BucketInfo", "Relabels", "VMRecord",
           "VMSpec", "announce_termination", "relabel"]


class Backend(Protocol):
    """A cloud: creates, reads and deletes VMs, and says where its bucket is."""

    name: str
    credentials_expire: bool  # True: bucket credentials must be refreshed and pushed to the VMs
    bucket_on_host: bool  # True: the bucket is a server on this machine, (re)started on demand by bucket()
    # The gpukit image its VMs boot, baked here before terraform runs: "tree" (a root filesystem), "disk"
    # (that tree as a boot disk); None: the cloud's own image.
    baked_image: str | None
    # None: VMs of one run reach each other (multi-node groups); else why they cannot (one line).
    multi_node: str | None
    # True: a VM applies the cluster's configuration seed at first boot (VMSpec.config_seed), so a VM
    # created while the configuration is unchanged needs no playbook (glue.operations.vm_seed).
    takes_config_seed: bool
    # True: delete_vm deletes (or releases) a VM. False: only terraform does (your own module's VMs): a
    # drill destroys its victim by a targeted terraform destroy (glue.operations.lifecycle.destroy_vm).
    deletes_vms: bool

    def check_host(self) -> None:
        """What this machine needs for the backend's VMs (tools, devices): one GlueError line when missing."""
        ...

    def readiness(self) -> Readiness:
        """`glue doctor`'s checks for this backend (this machine, or the cloud account), creating no VM."""
        ...

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        """Variables for terraform/envs/<backend>; checks the backend's own inputs before terraform runs."""
        ...

    def spares_problem(self) -> str | None:
        """None when this backend's VMs can wait idle as warm spares (`glue up --spares N`); else why not."""
        ...

    def create_vm(self, spec: VMSpec) -> VMRecord:
        """Create a VM and return once it accepts SSH."""
        ...

    def read_vm(self, vm_id: str) -> VMRecord | None:
        """The VM's current record, or None when it is gone (terminated, lost, deleted)."""
        ...

    def delete_vm(self, vm_id: str) -> None:
        """Delete the VM and everything on its disk. Deleting a gone VM is not an error."""
        ...

    def owned_vm_ids(self) -> list[str]:
        """Every VM this kit home created that still exists, recorded in Terraform's state or not: an
        apply killed mid-create can leave a VM the state never heard of (`glue up`/`down` remove it)."""
        ...

    def bucket(self) -> BucketInfo:
        """The persistent bucket, started or looked up on demand."""
        ...

    def bucket_credentials(self) -> BucketCredentials:
        """Credentials for the bucket (fresh ones where they expire)."""
        ...


@runtime_checkable
class AnnouncesTermination(Protocol):
    """A backend that can reclaim a VM the way clouds do: a termination notice on the VM, a grace period,
    then the VM is gone (the local backends, for tests and drills; a real cloud announces on its own)."""

    def announce_termination(self, vm_id: str, grace_s: float) -> None:
        """Deliver the notice, wait `grace_s`, delete the VM. Blocks for the grace period."""
        ...


def announce_termination(backend: Backend, vm_id: str, grace_s: float) -> None:
    """`backend.announce_termination`, or one line saying this backend cannot deliver a notice."""
    if not isinstance(backend, AnnouncesTermination):
        raise GlueError(f"the {backend.name} backend cannot deliver a termination notice (its cloud announces "
                        "reclaims itself)")
    backend.announce_termination(vm_id, grace_s)


@runtime_checkable
class Relabels(Protocol):
    """A backend that keeps the name a VM serves under itself (the ssh backend's pool records which host
    serves as which VM): a warm spare renamed in place by terraform (glue.operations.spare_state) is told."""

    def relabel_vm(self, vm_id: str, name: str) -> None:
        """The VM now serves as `name`."""
        ...


def relabel(backend: Backend, vm_id: str, name: str) -> None:
    """Tell a backend that records VM names of a rename in place; the others name VMs in terraform only."""
    if isinstance(backend, Relabels):
        backend.relabel_vm(vm_id, name)

"""The cluster as it is now: what `glue up` was last asked for, the VMs terraform reports, where the
bucket is. Lookups only (nothing on a VM changes), with one side effect: a bucket the backend serves on
this machine (local, qemu) is started again on demand by `bucket_info`. Depends on infra and cloud only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from glue.bucket_access import BucketInfo, own
from glue.cloud import BACKENDS, get_backend
from glue.cloud.base import SPARE_MARK, Backend
from glue.cluster import spare_roles
from glue.errors import GlueError
from glue.infra import inventory
from glue.infra.ssh_keys import public_key
from glue.infra.terraform import Terraform, is_spare

DEFAULT_VMS = 2
MAX_SPARES = 8  # terraform/modules/cluster/variables.tf validates spare_count the same way
SCHEDULERS = ("none", "slurm")  # `glue up --scheduler`: slurm is ansible/roles/slurm


@dataclass
class ClusterConfig:
    """What `glue up` was last asked for (kept in <home>/cluster.json)."""

    backend: str = "local"
    vms: int = DEFAULT_VMS
    name_prefix: str = "gpukit"
    spares: int = 0  # warm spares: configured, idle VMs a recovery takes (glue.operations.spares)
    scheduler: str = "none"  # "slurm": the slurm role runs slurmctld on <prefix>-1, slurmd on every VM
    hosts: str = ""  # the ssh backend's hosts file (`glue up --hosts`), an absolute path; "" elsewhere
    module: str = ""  # the terraform backend's root module (`glue up --module`), an absolute path; "" elsewhere
    # The user's own S3-compatible bucket (`glue up --bucket-endpoint URL --bucket NAME`): endpoint, name,
    # region, profile (glue.bucket_access.own.OwnBucket; never credentials); None: the backend's bucket.
    bucket: dict[str, str] | None = None

    @classmethod
    def load(cls, home: Path) -> ClusterConfig:
        """The saved config; the defaults before the first `glue up`. A damaged file is an error, never the
        defaults: those could name other VMs, and the next `glue up` would replace the cluster's."""
        path = home / "cluster.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise GlueError(f"{path} cannot be read ({exc}); restore it ({json.dumps(cls().__dict__)} is the "
                            "default) or, with no VMs running, remove it") from None
        ok = (isinstance(raw, dict) and set(raw) <= set(cls().__dict__) and raw.get("backend", "local") in BACKENDS
              and type(raw.get("vms", DEFAULT_VMS)) is int and 1 <= raw.get("vms", DEFAULT_VMS) <= 16
              and isinstance(raw.get("name_prefix", ""), str)
              and type(raw.get("spares", 0)) is int and 0 <= raw.get("spares", 0) <= MAX_SPARES
              and raw.get("scheduler", "none") in SCHEDULERS and isinstance(raw.get("hosts", ""), str)
              and isinstance(raw.get("module", ""), str))
        if ok and raw.get("bucket") is not None:
            raw["bucket"] = own.OwnBucket.parse(raw["bucket"], str(path)).model_dump()
        if not ok:
            raise GlueError(f"{path} is not a cluster config ({json.dumps(raw)[:120]}): fix it (keys: backend, one of "
                            f"{', '.join(BACKENDS)}; vms; name_prefix; spares; scheduler, one of "
                            f"{', '.join(SCHEDULERS)}; hosts, module: paths; bucket: endpoint, name, region, "
                            "profile) or, with no VMs running, remove it")
        return cls(**raw)

    def vm_names(self) -> list[str]:
        """The VMs this config asks for (terraform/modules/cluster names them <prefix>-1 ... <prefix>-N)."""
        return [f"{self.name_prefix}-{i}" for i in range(1, self.vms + 1)]

    def spare_names(self) -> list[str]:
        """The warm spares this config asks for (<prefix>-spare-1 ... <prefix>-spare-K)."""
        return [f"{self.name_prefix}{SPARE_MARK}{k}" for k in range(1, self.spares + 1)]

    def save(self, home: Path) -> None:
        tmp = home / "cluster.json.tmp"  # renamed into place: a reader never sees half a file
        tmp.write_text(json.dumps(self.__dict__))
        tmp.replace(home / "cluster.json")


def backend(home: Path) -> Backend:
    """The backend this kit's cluster runs on (`glue up --backend`, kept in the cluster config)."""
    return get_backend(ClusterConfig.load(home).backend, home)


def config_seed_path(home: Path) -> Path:
    """The cluster's configuration seed new VMs apply at first boot (glue.operations.vm_seed)."""
    return home / "seeds" / "current.tar.gz"


def tf_vars(home: Path, cfg: ClusterConfig) -> dict[str, Any]:
    backend = get_backend(cfg.backend, home)
    variables = backend.tf_vars(cfg.vms, cfg.name_prefix, public_key(home))
    if backend.takes_config_seed:
        variables["config_seed"] = str(config_seed_path(home))  # a path: what it holds never enters the state
    # Only when asked for: terraform's inputs of a cluster without spares stay those it was applied with.
    return {**variables, "spare_count": cfg.spares} if cfg.spares else variables


def all_hosts(home: Path) -> list[inventory.Host]:
    """Every VM of the cluster, its warm spares included, as they serve now: a spare a recovery took
    carries the lost VM's name until the next apply renames it (glue.cluster.spare_roles)."""
    cfg = ClusterConfig.load(home)
    if not (home / "terraform" / cfg.backend / "terraform.tfstate").exists():
        return []
    return spare_roles.applied(home, inventory.hosts_from_outputs(Terraform(home, cfg.backend).outputs()))


def hosts(home: Path) -> list[inventory.Host]:
    """The cluster's VMs that runs use (the warm spares left out)."""
    return [h for h in all_hosts(home) if not is_spare(h.name)]


def spares(home: Path) -> list[inventory.Host]:
    """The warm spares still idle."""
    return [h for h in all_hosts(home) if is_spare(h.name)]


def host(home: Path, name: str) -> inventory.Host:
    found = {h.name: h for h in hosts(home)}
    if name not in found:
        known = ", ".join(found) or "none (run `glue up`)"
        raise GlueError(f"unknown VM {name!r}; VMs in this cluster: {known}")
    return found[name]


def bucket_info(home: Path) -> BucketInfo:
    if (mine := own.load(home)) is not None:
        return mine.info  # the user's own bucket: as `glue up` checked and configured it, VMs up or not
    cfg = ClusterConfig.load(home)
    backend = get_backend(cfg.backend, home)
    # A bucket served on this machine is started again on demand (same port), VMs up or not.
    if backend.bucket_on_host:
        return backend.bucket()
    out = None
    if (home / "terraform" / cfg.backend / "terraform.tfstate").exists():
        out = Terraform(home, cfg.backend).outputs().get("bucket")
    # After `down` the outputs are gone but the bucket is not: ask the backend.
    return BucketInfo(**out) if out else backend.bucket()


class OnVm(Protocol):
    """What a run's records say a thing ran on: an attempt node (glue.runs.records.AttemptNode) or an attempt."""

    @property
    def vm(self) -> str: ...

    @property
    def vm_id(self) -> str | None: ...


def host_of_node(home: Path, node: OnVm) -> inventory.Host | None:
    """The inventory host of an attempt's (or node's) VM, if that very VM is still in the cluster."""
    for h in hosts(home):
        if h.name == node.vm and h.id == node.vm_id:
            return h
    return None

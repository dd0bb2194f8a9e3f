"""The cluster: bring it up (terraform, inventory, ansible), tear it down, report on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cloud.base import BucketInfo
from glue.errors import GlueError
from glue.infra import inventory, preflight, ssh
from glue.infra.keys import public_key
from glue.infra.terraform import Terraform
from glue.storage import bucket as bucket_store

DEFAULT_VMS = 2


@dataclass
class ClusterConfig:
    """What `glue up` was last asked for (kept in <home>/cluster.json)."""

    backend: str = "local"
    vms: int = DEFAULT_VMS
    name_prefix: str = "gpukit"

    @classmethod
    def load(cls, home: Path) -> ClusterConfig:
        try:
            return cls(**json.loads((home / "cluster.json").read_text()))
        except (OSError, ValueError, TypeError):
            return cls()

    def save(self, home: Path) -> None:
        (home / "cluster.json").write_text(json.dumps(self.__dict__))


def tf_vars(home: Path, cfg: ClusterConfig) -> dict[str, Any]:
    if cfg.backend == "lyceum":
        from glue.cloud.lyceum import tf_vars

        return tf_vars(cfg.vms, cfg.name_prefix, public_key(home))
    return {"vm_count": cfg.vms, "name_prefix": cfg.name_prefix, "gpu_type": "none",
            "ssh_public_key": public_key(home)}


def up(home: Path, cfg: ClusterConfig, console: Console, configure: bool = True) -> list[inventory.Host]:
    """terraform apply, then inventory + known_hosts, then the Ansible playbook (when configure)."""
    preflight.check(cfg.backend)
    tf = Terraform(home, cfg.backend, console)
    tf.apply(tf_vars(home, cfg))
    cfg.save(home)  # only once terraform accepted it: a rejected vm_count must not stick
    hosts = inventory.write(home, tf.outputs())
    if configure:
        configure_hosts(home, console)
    return hosts


def configure_hosts(home: Path, console: Console, limit: list[str] | None = None) -> None:
    """Run ansible/site.yml on the cluster (or on `limit`)."""
    from glue.infra import ansible

    result = ansible.converge(home, limit=limit)
    if not result.ok:
        failures = "; ".join(f"{h}: {m}" for h, m in result.failed.items())
        raise GlueError(f"configuring the VMs failed: {failures}")
    if limit is None:
        summary = ansible.verify(home, progress=False)  # the per-host summary `glue status` shows
        bad = [h for h, v in summary.items() if not v.get("ready")]
        if bad:
            raise GlueError(f"verify.yml: {', '.join(bad)} not ready; see `glue status`")


def down(home: Path, console: Console, force: bool = False) -> None:
    """Destroy the VMs once nothing would be lost (see glue.teardown); the bucket is never destroyed."""
    from glue import teardown

    cfg = ClusterConfig.load(home)
    preflight.check_terraform()
    for reason in teardown.check(home, force):
        console.print(f"[yellow]--force:[/] {reason}")
    tf = Terraform(home, cfg.backend, console)
    tf.apply(tf_vars(home, cfg), destroy=True)
    inventory.write(home, {"vms": {}, "bucket": tf.outputs().get("bucket", {})})


def hosts(home: Path) -> list[inventory.Host]:
    cfg = ClusterConfig.load(home)
    if not (home / "terraform" / cfg.backend / "terraform.tfstate").exists():
        return []
    return inventory.hosts_from_outputs(Terraform(home, cfg.backend).outputs())


def host(home: Path, name: str) -> inventory.Host:
    found = {h.name: h for h in hosts(home)}
    if name not in found:
        known = ", ".join(found) or "none (run `glue up`)"
        raise GlueError(f"unknown VM {name!r}; VMs in this cluster: {known}")
    return found[name]


def bucket_info(home: Path) -> BucketInfo:
    cfg = ClusterConfig.load(home)
    out = None
    if (home / "terraform" / cfg.backend / "terraform.tfstate").exists():
        out = Terraform(home, cfg.backend).outputs().get("bucket")
    # After `down` the outputs are gone but the bucket is not: ask the backend (starts it on demand).
    return BucketInfo(**out) if out else get_backend(cfg.backend, home).bucket()


def status(home: Path, verify: bool = False) -> dict[str, Any]:
    """The `glue status --json` shape: {"vms": [...], "bucket": {...}}; each VM carries the playbook's
    verify summary (mount round trip, GPU/driver facts, trainer runtime): the last one, or a fresh one."""
    from glue.infra import ansible

    cfg = ClusterConfig.load(home)
    current = hosts(home)
    if verify and current:
        ansible.verify(home, progress=False)
    record = ansible.last_verify(home) or {}
    checks = record.get("hosts", {})
    vms = [
        {"name": h.name, "id": h.id, "ssh_host": h.ssh_host, "ssh_port": h.ssh_port, "ssh_user": h.ssh_user,
         "gpu_type": h.gpu_type, "gpu_count": h.gpu_count, "backend": h.backend,
         "reachable": ssh.reachable(home, h),
         "verify": checks.get(h.name) if checks.get(h.name, {}).get("vm_id", h.id) == h.id else None,
         "verified_at": record.get("checked_at")}
        for h in current
    ]
    bucket: dict[str, Any] = {"endpoint": None, "name": None, "reachable": False}
    try:
        info = bucket_info(home)
    except GlueError as exc:
        bucket["error"] = str(exc)
    else:
        creds = get_backend(cfg.backend, home).bucket_credentials()
        bucket = {"endpoint": info.endpoint, "name": info.name, "region": info.region,
                  "reachable": bucket_store.reachable(info, creds)}
    return {"backend": cfg.backend, "vms": vms, "bucket": bucket}


def refresh_credentials(home: Path) -> None:
    """Expiring bucket credentials (lyceum's are STS-style): refresh them near expiry and push the new
    ones to every VM's trainer file and /mnt/s3 mount. A no-op for backends whose keys do not expire."""
    cfg = ClusterConfig.load(home)
    if cfg.backend == "lyceum":
        from glue.cloud import lyceum_refresh

        lyceum_refresh.push_if_refreshed(home, hosts(home))

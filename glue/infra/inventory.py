"""Terraform outputs -> the Ansible inventory and a pinned known_hosts file.

Host keys come from the `host_key` output of each VM; strict host key checking stays on, so a VM
whose key changed without Terraform replacing it is refused rather than trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from glue.infra.ssh_keys import client_key, ssh_dir


@dataclass(frozen=True)
class Host:
    name: str
    id: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    host_key: str
    gpu_type: str
    gpu_count: int
    backend: str

    @property
    def known_hosts_name(self) -> str:
        return self.ssh_host if self.ssh_port == 22 else f"[{self.ssh_host}]:{self.ssh_port}"


def hosts_from_outputs(outputs: dict[str, Any]) -> list[Host]:
    vms = outputs.get("vms") or {}
    return [
        Host(name=name, id=v["id"], ssh_host=v["ssh_host"], ssh_port=int(v["ssh_port"]), ssh_user=v["ssh_user"],
             host_key=v["host_key"], gpu_type=v["gpu_type"], gpu_count=int(v["gpu_count"]), backend=v["backend"])
        for name, v in sorted(vms.items())
    ]


def known_hosts_path(home: Path) -> Path:
    return ssh_dir(home) / "known_hosts"


def inventory_path(home: Path) -> Path:
    return home / "ansible" / "inventory.yml"


def write(home: Path, outputs: dict[str, Any]) -> list[Host]:
    """Write known_hosts and inventory.yml from terraform outputs; return the hosts."""
    hosts = hosts_from_outputs(outputs)
    known_hosts_path(home).write_text("".join(f"{h.known_hosts_name} {h.host_key}\n" for h in hosts))
    bucket = outputs.get("bucket") or {}
    inv = {
        "all": {
            "hosts": {
                h.name: {
                    "ansible_host": h.ssh_host,
                    "ansible_port": h.ssh_port,
                    "ansible_user": h.ssh_user,
                    "gpukit_vm_id": h.id,
                    "gpukit_backend": h.backend,
                    "gpukit_gpu_type": h.gpu_type,
                    "gpukit_gpu_count": h.gpu_count,
                }
                for h in hosts
            },
            "vars": {
                "ansible_ssh_private_key_file": str(client_key(home)),
                "gpukit_home": str(home),
                "gpukit_known_hosts": str(known_hosts_path(home)),
                "gpukit_bucket_endpoint": bucket.get("endpoint", ""),
                "gpukit_bucket_name": bucket.get("name", ""),
                "gpukit_bucket_region": bucket.get("region", ""),
                # A path, never the secret itself.
                "gpukit_bucket_credentials_file": str(home / "bucket" / "credentials.json"),
            },
        }
    }
    path = inventory_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inv, sort_keys=True))
    return hosts

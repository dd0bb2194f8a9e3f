"""Terraform outputs -> the Ansible inventory and a pinned known_hosts file.

The outputs contract (terraform/modules/cluster/outputs.tf, passed through by every env): `vms` maps
a VM name to the fields of `Host` (VM_FIELDS), and `bucket` holds the fields of `BucketInfo`
(BUCKET_FIELDS), never credentials. This module is the one place in Python that reads (and, for
test beds without Terraform, builds) that shape.

Host keys come from the `host_key` output of each VM; strict host key checking stays on, so a VM
whose key changed without Terraform replacing it is refused rather than trusted.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from glue.bucket_access import BucketInfo
from glue.cloud import jumps
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
    market: str = ""  # "spot", "on-demand", "" where the backend has none

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.ssh_host, self.ssh_port)


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


# The contract: what each entry of the `vms` output holds (its key is the name), and the `bucket` output.
VM_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Host) if f.name != "name")
BUCKET_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BucketInfo))
_INT_FIELDS = frozenset({"ssh_port", "gpu_count"})  # numbers in Terraform: may arrive as floats
_LATER_FIELDS = {"market": ""}  # added to the contract later: a state written before lacks them


def hosts_from_outputs(outputs: Mapping[str, Any]) -> list[Host]:
    def host(name: str, vm: Mapping[str, Any]) -> Host:
        values: dict[str, Any] = {k: int(vm[k]) if k in _INT_FIELDS else vm[k] if k in vm else _LATER_FIELDS[k]
                                  for k in VM_FIELDS}
        return Host(name=name, **values)

    return [host(name, vm) for name, vm in sorted((outputs.get("vms") or {}).items())]


def bucket_from_outputs(outputs: Mapping[str, Any]) -> BucketInfo:
    """The `bucket` output; fields missing from it (no state yet) read as ""."""
    bucket = outputs.get("bucket") or {}
    return BucketInfo(**{k: str(bucket.get(k) or "") for k in BUCKET_FIELDS})


def outputs_of(vms: Mapping[str, Any], bucket: BucketInfo) -> dict[str, Any]:
    """The outputs Terraform would give for these VMs (anything with the VM_FIELDS as attributes,
    e.g. glue.cloud's VMRecord) and this bucket: for a test bed that skips Terraform."""
    return {
        "vms": {name: {k: getattr(vm, k) for k in VM_FIELDS} for name, vm in sorted(vms.items())},
        "bucket": {k: getattr(bucket, k) for k in BUCKET_FIELDS},
    }


def _through(home: Path, jump: jumps.Jump) -> str:
    """ansible/group_vars/all.yml's SSH options (a host variable replaces them), plus the jump."""
    pinned = known_hosts_path(home)
    return (f"-o UserKnownHostsFile={pinned} -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes "
            f"-o ProxyCommand={shlex.quote(jumps.proxy_command(jump, pinned))}")


def known_hosts_path(home: Path) -> Path:
    return ssh_dir(home) / "known_hosts"


def inventory_path(home: Path) -> Path:
    return home / "ansible" / "inventory.yml"


def write(home: Path, outputs: Mapping[str, Any], also_known: Iterable[tuple[str, int, str]] = ()) -> list[Host]:
    """Write known_hosts and inventory.yml from terraform outputs; return the hosts. `also_known`: (host, port,
    host key) of machines outside the cluster that SSH must still trust (VMs kept for debugging)."""
    hosts = hosts_from_outputs(outputs)
    known_jumps = jumps.read(home)
    via = {h.name: j for h in hosts if (j := known_jumps.get(h.id)) is not None}
    lines = [f"{h.known_hosts_name} {h.host_key}\n" for h in hosts]
    lines += [f"{known_hosts_name(host, port)} {key}\n" for host, port, key in also_known]
    lines += sorted({f"{j.known_hosts_name} {j.host_key}\n" for j in via.values()})  # the jumps' pinned keys
    known_hosts_path(home).write_text("".join(lines))
    bucket = bucket_from_outputs(outputs)
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
                    # A non-root login escalates in every play (passwordless sudo). A host variable, so
                    # it overrides the plays' `become: false`; tasks delegated to the controller use
                    # the controller's variables and keep their own `become: false`.
                    **({"ansible_become": True, "ansible_become_method": "sudo"} if h.ssh_user != "root" else {}),
                    # Reached through the user's jump host, as glue's own connections are (glue.cloud.jumps).
                    **({"ansible_ssh_common_args": _through(home, via[h.name])} if h.name in via else {}),
                }
                for h in hosts
            },
            "vars": {
                "ansible_ssh_private_key_file": str(client_key(home)),
                "gpukit_home": str(home),
                "gpukit_known_hosts": str(known_hosts_path(home)),
                "gpukit_bucket_endpoint": bucket.endpoint,
                "gpukit_bucket_name": bucket.name,
                "gpukit_bucket_region": bucket.region,
                # A path, never the secret itself.
                "gpukit_bucket_credentials_file": str(home / "bucket" / "credentials.json"),
            },
        }
    }
    path = inventory_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inv, sort_keys=True))
    return hosts

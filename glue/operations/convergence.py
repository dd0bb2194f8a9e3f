"""What a `glue up` has left to do, so that one with nothing to change does nothing.

After an apply, glue records a hash of terraform's inputs; after a VM was converged and verified, the
parts its configuration came from (by VM id): the Ansible roles, the user's group vars, the bucket, its
credentials, the gpukit code the trainer role installs, the image it boots, the cluster's VMs (where the
group firewall is on: it lets exactly those in) and its own inventory entry. The next `glue up` applies only when
terraform's inputs changed or a VM is gone, and converges only the VMs whose parts differ, saying which
parts. The record is <home>/ansible/converged.json; this module is its only reader and writer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from glue.infra.ansible_run import ANSIBLE_DIR
from glue.infra.inventory import inventory_path
from glue.infra.source_hash import source_hash
from glue.paths import PROJECT_ROOT

TERRAFORM_DIR = PROJECT_ROOT / "terraform"


def record_path(home: Path) -> Path:
    return home / "ansible" / "converged.json"


def user_group_vars(home: Path) -> Path:
    """Where a user's role variables go (beside the inventory glue writes)."""
    return home / "ansible" / "group_vars"


def _digest(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(hashlib.sha256(chunk).digest())
    return h.hexdigest()[:16]


def tree_hash(root: Path) -> str:
    """Names and contents of every file under root ("" when there is none)."""
    if not root.is_dir():
        return ""
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(*(c for p in files for c in (p.relative_to(root).as_posix().encode(), p.read_bytes())))


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def terraform_inputs(backend: str, variables: Mapping[str, Any]) -> str:
    """What an apply depends on: the variables, the modules and the provider (part of the gpukit code)."""
    return _digest(backend.encode(), _json(variables), tree_hash(TERRAFORM_DIR).encode(), source_hash().encode())


# The backends whose VMs the group firewall role leaves alone by default (its defaults/main.yml says why).
NO_GROUP_FIREWALL = ("local", "qemu")


def _peers_matter(home: Path, hosts: Mapping[str, Any]) -> bool:
    """Whether the list of the cluster's VMs is part of each VM's configuration. It reaches a VM only through
    the group firewall's rules, so a replaced VM reconverges its peers only where that role is on: not on
    local or qemu VMs, unless the user's group vars set it."""
    if any(h.get("gpukit_backend") not in NO_GROUP_FIREWALL for h in hosts.values()):
        return True
    vars_dir = user_group_vars(home)
    return vars_dir.is_dir() and any("group_firewall" in p.read_text(errors="replace")
                                     for p in vars_dir.rglob("*") if p.is_file())


@dataclass(frozen=True)
class VMParts:
    """One VM of the inventory: its id and the hashes of what its configuration comes from."""

    id: str
    parts: dict[str, str]


def local_parts(home: Path, image: str | None) -> dict[str, str]:
    """The shared parts known without an inventory (after `glue down` there is none): the roles, the
    user's group vars, the gpukit code and the image."""
    return {"roles": tree_hash(ANSIBLE_DIR), "group vars": tree_hash(user_group_vars(home)), "code": source_hash(),
            "image": image or ""}


def vm_parts(home: Path, image: str | None) -> dict[str, VMParts]:
    """{VM name: VMParts} for every VM of the inventory as it is now."""
    inv = yaml.safe_load(inventory_path(home).read_text())["all"]
    cred_file = Path(inv["vars"]["gpukit_bucket_credentials_file"])
    shared = {
        **local_parts(home, image),
        "bucket": _digest(_json(inv["vars"])),
        "credentials": _digest(cred_file.read_bytes()) if cred_file.is_file() else "",
    }
    if _peers_matter(home, inv["hosts"]):
        shared["cluster VMs"] = _digest(_json(sorted((n, h["gpukit_vm_id"]) for n, h in inv["hosts"].items())))
    return {name: VMParts(id=str(entry["gpukit_vm_id"]), parts={**shared, "inventory entry": _digest(_json(entry))})
            for name, entry in inv["hosts"].items()}


def _load(home: Path) -> dict[str, Any]:
    try:
        data = json.loads(record_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(home: Path, data: dict[str, Any]) -> None:
    path = record_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)  # a reader never sees half a record


def applied(home: Path) -> str | None:
    """The terraform inputs of the last successful apply."""
    value = _load(home).get("terraform")
    return value if isinstance(value, str) else None


def record_apply(home: Path, inputs: str | None) -> None:
    """After a successful apply (None: after a destroy, or an apply whose inputs are not known)."""
    data = _load(home)
    data["terraform"] = inputs
    _save(home, data)


def reasons(home: Path, names: Iterable[str], now: Mapping[str, VMParts]) -> dict[str, str]:
    """{VM name: why it must be converged} for the named VMs whose recorded parts differ from `now`."""
    done = _load(home).get("vms") or {}
    out = {}
    for name in names:
        before = done.get(now[name].id, {}).get("parts")
        if not isinstance(before, dict):
            out[name] = "never configured"
            continue
        changed = [k for k, v in now[name].parts.items() if before.get(k) != v]
        if changed:
            out[name] = f"{', '.join(changed)} changed"
    return out


def record_converged(home: Path, names: Iterable[str], now: Mapping[str, VMParts]) -> None:
    """The named VMs were converged with `now`'s parts. VMs no longer in the inventory are forgotten."""
    data = _load(home)
    ids = {v.id for v in now.values()}
    vms = {vid: v for vid, v in (data.get("vms") or {}).items() if vid in ids}
    at = datetime.now(UTC).isoformat(timespec="seconds")
    for name in names:
        vms[now[name].id] = {"name": name, "parts": dict(now[name].parts), "at": at}
    data["vms"] = vms
    _save(home, data)


def converged_at(home: Path, vm_id: str) -> str | None:
    """When the VM was last converged (UTC ISO), or None."""
    at = ((_load(home).get("vms") or {}).get(vm_id) or {}).get("at")
    return at if isinstance(at, str) else None


def forget(home: Path) -> None:
    """After `glue down`: nothing is applied or converged any more."""
    record_path(home).unlink(missing_ok=True)

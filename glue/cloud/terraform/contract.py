"""The outputs a user's module must emit (the kit's contract, terraform/modules/cluster/outputs.tf), checked
and put in the kit's shape: `vms` maps each VM's name (<prefix>-1 ... <prefix>-N) to its id, ssh_host,
ssh_port, ssh_user, host_key ("" or left out: trusted on first use), gpu_type and gpu_count (market
optional); `bucket` holds endpoint, name and region. Every VM's `backend` reads "terraform" (the kit asks
this backend about it, whatever provider made it). A broken output is one line naming the field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from glue.errors import GlueError

BACKEND = "terraform"
MARKETS = ("", "spot", "on-demand")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_HOST = re.compile(r"^[A-Za-z0-9.:_-]+$")
_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+$")
_GPU = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# field -> what it must be, said when it is missing or wrong
FIELDS = {
    "id": "the VM resource's id, a non-empty string",
    "ssh_host": "the address gpukit reaches the VM at over SSH",
    "ssh_port": "a number from 1 to 65535",
    "ssh_user": "root or a user with passwordless sudo that holds var.ssh_public_key",
    "gpu_type": 'the GPU model in lowercase, "none" without one',
    "gpu_count": "a whole number of GPUs, 0 to 16",
}
BUCKET = {"endpoint": "the S3 endpoint URL (http:// or https://)", "name": "the bucket's name",
          "region": 'its region ("" where it has none)'}


class ContractBroken(GlueError):
    """The module's outputs break the contract: one line naming the output and the field."""


def _broken(where: str, field: str, want: str, got: object = None) -> ContractBroken:
    said = f"has no {field}" if got is None else f"has a wrong {field} ({repr(got)[:60]})"
    return ContractBroken(f"your module's output {where} {said}: it must be {want}; fix the output "
                          "(docs/guides/own-terraform.md) and run `glue up` again")


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if isinstance(value, int) else None


def _value(where: str, field: str, value: object) -> Any:
    """The field's value in the kit's shape; ContractBroken when it is wrong."""
    if value is None or (value == "" and field != "host_key"):
        raise _broken(where, field, FIELDS[field])
    if field in ("ssh_port", "gpu_count"):
        num = _int(value)
        lo, hi = (1, 65535) if field == "ssh_port" else (0, 16)
        if num is None or not lo <= num <= hi:
            raise _broken(where, field, FIELDS[field], value)
        return num
    if isinstance(value, (int, float)) and field == "id":
        return str(value)
    ok = {"ssh_host": _HOST, "ssh_user": _USER, "gpu_type": _GPU}.get(field)
    if not isinstance(value, str) or (ok is not None and not ok.match(value)):
        raise _broken(where, field, FIELDS[field], value)
    return value


def vm(name: str, entry: object) -> dict[str, Any]:
    """One entry of `vms` in the kit's shape."""
    where = f'vms["{name}"]'
    if not isinstance(entry, Mapping):
        raise ContractBroken(f"your module's output {where} is not an object ({str(entry)[:60]!r}); each VM is "
                             f"{{{', '.join(FIELDS)}, host_key}} (docs/guides/own-terraform.md)")
    out = {field: _value(where, field, entry.get(field)) for field in FIELDS}
    key = entry.get("host_key") or ""
    if not isinstance(key, str) or (key and not _KEY.match(" ".join(key.split()[:2]))):
        raise _broken(where, "host_key", '"<type> <base64>" as in the VM\'s /etc/ssh/ssh_host_*_key.pub, or "" '
                                         "to trust it on first use", key)
    market = entry.get("market") or ""
    if market not in MARKETS:
        raise _broken(where, "market", 'spot, on-demand or ""', market)
    return {**out, "host_key": " ".join(key.split()[:2]), "market": market, "backend": BACKEND}


def bucket(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise ContractBroken("your module emits no output `bucket` (an object: endpoint, name, region; never "
                             "credentials): add it (docs/guides/own-terraform.md) and run `glue up` again")
    out = {}
    for field, want in BUCKET.items():
        value = raw.get(field)
        if value is None or not isinstance(value, str) or (field != "region" and not value):
            raise _broken("bucket", field, want, value if isinstance(value, str) and value else None)
        out[field] = value
    if not out["endpoint"].startswith(("http://", "https://")):
        raise _broken("bucket", "endpoint", BUCKET["endpoint"], out["endpoint"])
    return out


def check(raw: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The whole outputs in the kit's shape, the VMs exactly `names`; ContractBroken on the first problem."""
    vms = raw.get("vms")
    if not isinstance(vms, Mapping):
        raise ContractBroken("your module emits no output `vms` (a map: VM name => {id, ssh_host, ssh_port, "
                             "ssh_user, host_key, gpu_type, gpu_count}): add it (docs/guides/own-terraform.md)")
    missing = [n for n in names if n not in vms]
    extra = sorted(set(vms) - set(names))
    if missing or extra:
        raise ContractBroken(f"your module's output vms {'lacks ' + ', '.join(missing) if missing else ''}"
                             f"{' and ' if missing and extra else ''}{'has ' + ', '.join(extra) if extra else ''}: "
                             f"its keys must be {', '.join(names)} (var.name_prefix-1 ... -var.vm_count)")
    return {"vms": {n: vm(n, vms[n]) for n in names}, "bucket": bucket(raw.get("bucket"))}


def lenient(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The outputs as far as they keep the contract: a VM entry that breaks it is left out (so `glue down`
    and `glue status` still work on a module whose outputs broke); a broken bucket reads as none."""
    vms: dict[str, Any] = {}
    for name, entry in (raw.get("vms") or {}).items() if isinstance(raw.get("vms"), Mapping) else ():
        try:
            vms[name] = vm(name, entry)
        except ContractBroken:
            continue
    try:
        return {"vms": vms, "bucket": bucket(raw.get("bucket"))}
    except ContractBroken:
        return {"vms": vms}

"""Host keys of the module's VMs whose `host_key` output is empty (most providers cannot read a VM's key):
trusted on first use, right after the apply that made the VM, with the fingerprint shown and recorded
in <home>/user-module/host_keys.json (by VM id: a replaced VM is a new id, read again). From then on
the key is pinned in known_hosts like any other, so a changed key is refused by SSH."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glue.cloud.ssh import remote
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError


def _path(home: Path) -> Path:
    return home / "user-module" / "host_keys.json"


def pins(home: Path) -> dict[str, dict[str, Any]]:
    """{VM id: {key, fingerprint, name, ssh_host, ssh_port, at}} of the keys trusted on first use."""
    try:
        raw = json.loads(_path(home).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise GlueError(f"{_path(home)} cannot be read ({exc}); remove it and run `glue up` (every empty "
                        "host_key is then trusted on first use again)") from None
    return raw if isinstance(raw, dict) else {}


def entry(name: str, vm: dict[str, Any]) -> HostEntry:
    """The VM as an SSH target of its own (no login: its host key is all that is read)."""
    return HostEntry(name=name, address=vm["ssh_host"], port=vm["ssh_port"], user=vm["ssh_user"],
                     identity_file="-")


def scan(name: str, vm: dict[str, Any], wait_s: float) -> str:
    """The key the VM presents, asked until `wait_s` has passed (a VM just made may still be booting)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return remote.server_key(entry(name, vm), timeout=5.0)
        except GlueError as exc:
            if time.monotonic() >= deadline:
                raise GlueError(f"{exc} (its host key is read on first use: `glue up` once it answers)") from None
        time.sleep(2.0)


def fill(home: Path, vms: dict[str, dict[str, Any]], wait_s: float | None, echo: Callable[[str], None]) -> None:
    """Empty host keys in `vms` set from the pins; a VM never seen before is read now and pinned (wait_s
    None: not read, its key stays empty). Pins of VMs no longer in `vms` are dropped when anything is pinned."""
    known = pins(home)
    new: dict[str, dict[str, Any]] = {}
    for name, vm in sorted(vms.items()):
        if vm["host_key"]:
            continue
        pin = known.get(vm["id"])
        if pin is not None and (pin["ssh_host"], pin["ssh_port"]) == (vm["ssh_host"], vm["ssh_port"]):
            vm["host_key"] = pin["key"]
            continue
        if wait_s is None:
            continue
        key = scan(name, vm, wait_s)
        vm["host_key"] = key
        new[vm["id"]] = {"key": key, "fingerprint": remote.fingerprint(key), "name": name, "ssh_host": vm["ssh_host"],
                         "ssh_port": vm["ssh_port"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        echo(f"{name}: host key {key.split()[0]} {remote.fingerprint(key)} at {vm['ssh_host']}:{vm['ssh_port']} "
             f"trusted on first use (your module's host_key is empty; recorded in {_path(home)})")
    if new:
        ids = {vm["id"] for vm in vms.values()}
        kept = {i: p for i, p in known.items() if i in ids}
        path = _path(home)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**kept, **new}, indent=1, sort_keys=True))
        tmp.replace(path)

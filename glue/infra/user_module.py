"""glue/infra/terraform.py's steps that differ for the terraform backend, whose env
(terraform/envs/terraform) calls the user's own root module (`glue up --backend terraform --module DIR`):

place       the module's absolute path written into the env's call of it (so the module's relative paths
            keep working where it is)
outputs     its outputs checked against the kit's contract (one line naming the field), in the kit's shape;
            right after an apply strictly, and the VMs' empty host keys trusted on first use
replacing   the kit's addresses of VMs (module.cluster.gpukit_vm.node["<name>"]) turned into the module's
            own (the resource whose id is the VM's id), and every VM that no longer answers SSH added:
            `-replace` for a lost VM, whatever its provider still says about it
explain     terraform's error about a missing output or input said as the contract's fix
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glue.cloud.terraform import contract, hostkeys, module
from glue.cloud.terraform.backend import TerraformBackend, state_outputs
from glue.errors import GlueError

BACKEND = contract.BACKEND
PLACEHOLDER = '"GPUKIT_USER_MODULE"'
FIRST_USE_WAIT_S = 300.0  # a VM just made may take this long to start sshd (cloud images: ~30-90 s)
_NAME = re.compile(r'\["([^"]+)"\]$')


def place(home: Path) -> Callable[[str], str]:
    where = json.dumps(str(module.recorded(home)))
    return lambda text: text.replace(PLACEHOLDER, where)


def _names(workdir: Path) -> list[str]:
    """The VM names the last apply asked for (its variables: vm_count, name_prefix)."""
    try:
        tfv = json.loads((workdir / "gpukit.auto.tfvars.json").read_text())
    except (OSError, ValueError):
        return []
    return [f"{tfv['name_prefix']}-{i}" for i in range(1, int(tfv["vm_count"]) + 1)]


def outputs(home: Path, workdir: Path, raw: dict[str, Any], strict: bool,
            echo: Callable[[str], None]) -> dict[str, Any]:
    """Strict (right after an apply): the whole contract or ContractBroken, and unseen host keys read now.
    Else as far as the outputs keep the contract (`glue down` and `glue status` work on a broken module)."""
    if not raw:
        return raw
    if not strict:
        found = contract.lenient(raw)
        hostkeys.fill(home, found["vms"], None, echo)
        return found
    found = contract.check(raw, _names(workdir))
    TerraformBackend(home).remember_bucket(found["bucket"])
    hostkeys.fill(home, found["vms"], FIRST_USE_WAIT_S, echo)
    return found


def real(home: Path, addresses: list[str], state_ids: dict[str, str]) -> list[str]:
    """The module's own addresses for the kit's VM addresses (module.cluster.gpukit_vm.node["<name>"]):
    the resource in the state whose id is that VM's id; an address of no VM of the outputs as it is."""
    vms = state_outputs(home)["vms"]
    by_id: dict[str, str] = {}
    for addr, vm_id in sorted(state_ids.items()):
        by_id.setdefault(vm_id, addr)
    out = []
    for addr in addresses:
        found = _NAME.search(addr)
        vm = vms.get(found.group(1)) if found else None
        out.append(by_id.get(vm["id"], addr) if vm else addr)
    return out


def replacing(home: Path, addresses: list[str], state_ids: dict[str, str]) -> list[str]:
    """`real` of the addresses asked for, and those of the VMs in the state that no longer answer SSH."""
    backend = TerraformBackend(home)
    lost = [f'["{n}"]' for n, vm in state_outputs(home)["vms"].items() if backend.read_vm(vm["id"]) is None]
    found = [a for a in real(home, lost, state_ids) if a not in lost]  # (an id no resource has: not replaced)
    return list(dict.fromkeys(real(home, addresses, state_ids) + found))


def explain(text: str) -> str:
    """terraform's failure about the contract's inputs or outputs, as the fix; else `text` unchanged."""
    said = re.search(r'output value with the name "(\w+)" has not been declared|This object does not have an '
                     r'attribute named "(vms|bucket)"', text)
    if said:
        raise contract.ContractBroken(f"your module emits no output `{said.group(1) or said.group(2)}`: add it "
                                      "(the contract: docs/guides/own-terraform.md) and run `glue up` again")
    said = re.search(r'An argument named "(\w+)" is not expected here', text)
    if said:
        raise GlueError(f"your module declares no variable {said.group(1)}; gpukit passes "
                        f"{', '.join(module.INPUTS)}: add `variable \"{said.group(1)}\" {{}}` "
                        "(docs/guides/own-terraform.md)")
    return text

"""The terraform backend's contract (glue.cloud.terraform.contract) and `glue up --backend terraform --module
DIR` on modules that break it: one line naming the output and the field, exit 1, nothing configured (no
inventory, no playbook), and `glue down` still works. The modules here make no VM: their outputs are
constants, so terraform runs for real in a second or two."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from glue.cli import cli
from glue.cloud.terraform import contract
from glue.infra import user_module

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHm0bO9ZqWcS6kqK7pBZ0M2m2Yc0x1F5uKjM2m2Yc0x1"


def _vm(**changes: Any) -> dict[str, Any]:
    vm = {"id": "i-1", "ssh_host": "10.0.0.1", "ssh_port": 22, "ssh_user": "ubuntu", "host_key": "",
          "gpu_type": "h100", "gpu_count": 8}
    return {k: v for k, v in {**vm, **changes}.items() if v is not None}


BUCKET = {"endpoint": "https://s3.eu-west-1.amazonaws.com", "name": "team-ckpts", "region": "eu-west-1"}


def test_outputs_that_keep_the_contract_are_put_in_the_kits_shape() -> None:
    out = contract.check({"vms": {"gpukit-1": _vm(ssh_port=22.0, host_key=KEY + " root@vm")}, "bucket": BUCKET},
                         ["gpukit-1"])
    assert out["vms"]["gpukit-1"] == {**_vm(host_key=KEY), "backend": "terraform", "market": ""}
    assert out["bucket"] == BUCKET


@pytest.mark.parametrize(("vm", "said"), [
    (_vm(ssh_port=None), 'vms["gpukit-1"] has no ssh_port: it must be a number from 1 to 65535'),
    (_vm(ssh_port=70000), "vms[\"gpukit-1\"] has a wrong ssh_port (70000): it must be a number"),
    (_vm(id=""), 'vms["gpukit-1"] has no id: it must be the VM resource\'s id'),
    (_vm(ssh_user="Ubuntu Admin"), "has a wrong ssh_user ('Ubuntu Admin')"),
    (_vm(gpu_count=None), 'vms["gpukit-1"] has no gpu_count'),
    (_vm(host_key="not a key"), "has a wrong host_key ('not a key')"),
    (_vm(market="preemptible"), "has a wrong market ('preemptible'): it must be spot, on-demand or \"\""),
])
def test_a_broken_vm_entry_is_one_line_naming_the_field(vm: dict[str, Any], said: str) -> None:
    with pytest.raises(contract.ContractBroken) as exc:
        contract.check({"vms": {"gpukit-1": vm}, "bucket": BUCKET}, ["gpukit-1"])
    assert said in str(exc.value) and "\n" not in str(exc.value)
    assert "docs/guides/own-terraform.md" in str(exc.value)


def test_the_vms_must_be_those_asked_for_and_the_bucket_whole() -> None:
    with pytest.raises(contract.ContractBroken, match=r"vms lacks gpukit-2 and has vm-a: its keys must be "
                                                      r"gpukit-1, gpukit-2"):
        contract.check({"vms": {"gpukit-1": _vm(), "vm-a": _vm()}, "bucket": BUCKET}, ["gpukit-1", "gpukit-2"])
    with pytest.raises(contract.ContractBroken, match="output bucket has no name"):
        contract.check({"vms": {}, "bucket": {**BUCKET, "name": ""}}, [])
    with pytest.raises(contract.ContractBroken, match=r"wrong endpoint \('s3.amazonaws.com'\)"):
        contract.check({"vms": {}, "bucket": {**BUCKET, "endpoint": "s3.amazonaws.com"}}, [])
    with pytest.raises(contract.ContractBroken, match="emits no output `vms`"):
        contract.check({"bucket": BUCKET}, [])
    # What `glue down` and `glue status` read: the entries that keep the contract.
    assert list(contract.lenient({"vms": {"gpukit-1": _vm(ssh_port=None), "gpukit-2": _vm()}})["vms"]) == ["gpukit-2"]


def test_the_kits_vm_address_becomes_the_modules_own(tmp_path: Path) -> None:
    state = tmp_path / "terraform" / "terraform" / "terraform.tfstate"
    state.parent.mkdir(parents=True)
    vms = {"gpukit-1": _vm(id="i-1"), "gpukit-2": _vm(id="i-2", ssh_host="10.0.0.2")}
    state.write_text(json.dumps({"outputs": {"vms": {"value": vms}, "bucket": {"value": BUCKET}}}))
    ids = {'module.user.aws_instance.gpu["gpukit-1"]': "i-1", 'module.user.aws_instance.gpu["gpukit-2"]': "i-2",
           "module.user.aws_security_group.ssh": "sg-1"}
    assert user_module.real(tmp_path, ['module.cluster.gpukit_vm.node["gpukit-2"]', "module.x.y"], ids) == [
        'module.user.aws_instance.gpu["gpukit-2"]', "module.x.y"]


MODULE = """
variable "vm_count" {}
variable "name_prefix" {}
variable "ssh_public_key" {}
output "vms" {
  value = { for i in range(var.vm_count) : "${var.name_prefix}-${i + 1}" => {
    id = "vm-${i}", ssh_host = "10.0.0.${i + 1}", ssh_user = "ubuntu", host_key = "HOST_KEY", gpu_type = "h100",
    gpu_count = 1 } }
}
output "bucket" {
  value = { endpoint = "https://s3.example.com", name = "b", region = "us-east-1" }
}
""".replace("HOST_KEY", KEY)


def _glue(home: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args), env={"GPUKIT_HOME": str(home)})
    return res.exit_code, res.stderr


def _error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_up_on_a_module_that_breaks_the_contract_is_one_line_and_configures_nothing(tmp_path: Path) -> None:
    module, home = tmp_path / "mine", tmp_path / "home"
    module.mkdir()
    (module / "main.tf").write_text(MODULE)  # every VM lacks ssh_port
    code, err = _glue(home, "up", "--backend", "terraform", "--module", str(module), "--vms", "2")
    assert code == 1
    assert _error(err) == ("Error: your module's output vms[\"gpukit-1\"] has no ssh_port: it must be a number from 1 "
                           "to 65535; fix the output (docs/guides/own-terraform.md) and run `glue up` again")
    assert not (home / "ansible" / "inventory.yml").exists()  # nothing configured, no playbook
    assert json.loads((home / "cluster.json").read_text())["module"] == str(module)  # kept like --vms
    code, err = _glue(home, "down")
    assert code == 0, err

    (module / "main.tf").write_text(MODULE.replace('output "bucket"', 'output "store"'))
    code, err = _glue(home, "up", "--vms", "1")  # the module as last time
    assert code == 1
    assert _error(err).startswith("Error: your module emits no output `bucket`: add it")


def test_a_module_that_takes_no_kit_inputs_or_is_missing_is_refused_before_terraform(tmp_path: Path) -> None:
    module, home = tmp_path / "mine", tmp_path / "home"
    module.mkdir()
    (module / "main.tf").write_text(MODULE.replace('variable "ssh_public_key" {}', ""))
    code, err = _glue(home, "up", "--backend", "terraform", "--module", str(module))
    assert code == 1 and _error(err).startswith(f"Error: --module {module}: declares no variable ssh_public_key; "
                                                "gpukit passes vm_count, name_prefix, ssh_public_key")
    code, err = _glue(home, "up", "--backend", "terraform", "--module", str(tmp_path / "nowhere"))
    assert code == 1 and "no such directory" in _error(err)
    code, err = _glue(home, "up", "--backend", "terraform")
    assert code == 2 and "--backend terraform needs --module DIR" in err
    code, err = _glue(home, "up", "--module", str(module))
    assert code == 2 and "--module is for --backend terraform" in err
    (module / "main.tf").write_text(MODULE)
    code, err = _glue(home, "up", "--backend", "terraform", "--module", str(module), "--spares", "1")
    assert code == 1 and _error(err).startswith("Error: --spares 1: warm spares are not supported with --backend "
                                                "terraform yet")
    assert not (home / "terraform" / "terraform").exists() and not (home / "cluster.json").exists()

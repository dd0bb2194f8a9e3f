"""The gpukit provider under real terraform: create, read, drift on out-of-band loss, delete; the envs'
cluster module in the kit home, and a state from before the module moved (not re-created)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from rich.console import Console

from glue.cloud.local.backend import LocalBackend
from glue.errors import GlueError
from glue.infra import inventory
from glue.infra.ssh_keys import public_key
from glue.infra.terraform import Terraform, vm_address

from .conftest import Kit

pytestmark = pytest.mark.integration


# `stress` (make test-all): make test has the provider create VMs, a VM killed out of band re-created by the
# next apply, and the VMs deleted, through `glue up` and `glue down`
# (tests/integration/test_cluster.py::test_up_ssh_isolation_replace_down), and a healthy cluster planning no
# change (tests/integration/test_up_converge.py); this drives terraform directly.
@pytest.mark.stress
def test_create_read_lost_vm_plans_replacement_delete(kit: Kit) -> None:
    tf = Terraform(kit.home, "local", Console(quiet=True))
    variables = {"vm_count": 1, "name_prefix": "prov", "gpu_type": "none", "ssh_public_key": public_key(kit.home)}
    tf.apply(variables)
    vm = tf.outputs()["vms"]["prov-1"]
    assert set(vm) == set(inventory.VM_FIELDS)
    assert vm["ssh_host"] == "127.0.0.1" and vm["host_key"].startswith("ssh-ed25519 ")
    assert set(tf.outputs()["bucket"]) == set(inventory.BUCKET_FIELDS)

    backend = LocalBackend(kit.home)
    rec = backend.read_vm(vm["id"])
    assert rec is not None and rec.status == "running" and rec.ssh_port == vm["ssh_port"]
    assert tf.plan_changes(variables) == []  # a healthy VM: no drift

    # Lose the VM out of band: read reports it gone, so the plan creates it again.
    state = json.loads((kit.home / "vms" / vm["id"] / "state.json").read_text())
    os.kill(state["init_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30  # the machine is reaped, then reads as gone
    while backend.read_vm(vm["id"]) is not None:
        assert time.monotonic() < deadline, "a killed VM still reads as alive after 30 s"
        time.sleep(0.1)
    assert tf.plan_changes(variables) == [(vm_address("prov-1"), "create")]

    tf.apply(variables)
    new_id = tf.outputs()["vms"]["prov-1"]["id"]
    assert new_id != vm["id"] and backend.read_vm(new_id) is not None

    tf.apply(variables, destroy=True)
    assert backend.read_vm(new_id) is None
    assert list((kit.home / "vms").iterdir()) == []


def test_credentials_never_reach_terraform_state(kit: Kit) -> None:
    tf = Terraform(kit.home, "local", Console(quiet=True))
    tf.apply({"vm_count": 1, "name_prefix": "sec", "gpu_type": "none", "ssh_public_key": public_key(kit.home)})
    creds = json.loads((kit.home / "bucket" / "credentials.json").read_text())
    assert oct((kit.home / "bucket" / "credentials.json").stat().st_mode & 0o777) == "0o600"
    for path in (kit.home / "terraform").rglob("*"):
        if path.is_file() and path.suffix in {".tfstate", ".json", ".backup", ".tf"}:
            text = path.read_text(errors="replace")
            assert creds["secret_key"] not in text and creds["access_key"] not in text, path
    tf.apply({"vm_count": 1, "name_prefix": "sec", "gpu_type": "none", "ssh_public_key": public_key(kit.home)},
             destroy=True)


# terraform/envs/local before terraform/modules/cluster: the VMs were resources of the root config.
ROOT_LAYOUT = """
terraform {
  required_providers {
    gpukit = {
      source  = "local/gpukit/gpukit"
      version = "~> 0.1"
    }
  }
}

provider "gpukit" {
  backend = "local"
}

variable "vm_count" { type = number }
variable "name_prefix" { type = string }
variable "gpu_type" { type = string }
variable "ssh_public_key" { type = string }

data "gpukit_bucket" "this" {}

resource "gpukit_vm" "node" {
  for_each = toset([for i in range(var.vm_count) : "${var.name_prefix}-${i + 1}"])

  name           = each.key
  gpu_type       = var.gpu_type
  gpu_count      = 0
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
}

output "vms" {
  value = {
    for name, vm in gpukit_vm.node : name => {
      id        = vm.id
      ssh_host  = vm.ssh_host
      ssh_port  = vm.ssh_port
      ssh_user  = vm.ssh_user
      host_key  = vm.host_key
      gpu_type  = vm.gpu_type
      gpu_count = vm.gpu_count
      backend   = vm.backend
    }
  }
}

output "bucket" {
  value = {
    endpoint = data.gpukit_bucket.this.endpoint
    name     = data.gpukit_bucket.this.name
    region   = data.gpukit_bucket.this.region
  }
}
"""


def test_state_from_before_the_module_is_moved_not_recreated_and_replace_by_address(kit: Kit, tmp_path: Path) -> None:
    variables = {"vm_count": 1, "name_prefix": "mig", "gpu_type": "none", "ssh_public_key": public_key(kit.home)}
    old_env = tmp_path / "old-env"
    old_env.mkdir()
    (old_env / "main.tf").write_text(ROOT_LAYOUT)
    old = Terraform(kit.home, "local", Console(quiet=True))
    old.src = old_env
    old.apply(variables)
    before = old.outputs()
    assert list(before["vms"]) == ["mig-1"]

    tf = Terraform(kit.home, "local", Console(quiet=True))
    assert tf.plan_changes(variables) == [(vm_address("mig-1"), "move")]  # moved: no destroy, no create
    # The env's copy calls the module's copy beside it in the kit home.
    assert 'source = "../modules/cluster"' in (tf.workdir / "main.tf").read_text()
    module = kit.home / "terraform" / "modules" / "cluster"
    assert sorted(p.name for p in module.glob("*.tf")) == ["main.tf", "outputs.tf", "variables.tf", "versions.tf"]
    tf.apply(variables)
    # The same VM; the contract has gained `market` since ("" on the local backend: no pools).
    assert tf.outputs() == {**before, "vms": {n: {**vm, "market": ""} for n, vm in before["vms"].items()}}
    assert tf.plan_changes(variables) == []

    # Recovery abandons a live VM by its address; an address that names nothing is an error, not a no-op.
    tf.apply(variables, replace=[vm_address("mig-1")])
    new_id = tf.outputs()["vms"]["mig-1"]["id"]
    assert new_id != before["vms"]["mig-1"]["id"]
    with pytest.raises(GlueError, match="replaced nothing"):
        tf.apply(variables, replace=['gpukit_vm.node["mig-1"]'])
    assert tf.outputs()["vms"]["mig-1"]["id"] == new_id

    tf.apply(variables, destroy=True)
    assert list((kit.home / "vms").iterdir()) == []

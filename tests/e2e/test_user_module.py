"""Your own Terraform (`glue up --backend terraform --module DIR`): a root module outside the repo, written
here as a user would, makes the VMs with the gpukit provider's local backend used directly, as if it were a
third party's provider (its own resource names, its host keys left empty as most clouds' are). gpukit runs
terraform on it, reads its outputs, trusts the host keys on first use; a run is deployed, its VM is lost,
`glue recover` replaces it (`-replace` of the module's own resource) and verifies the resume; `glue down`
destroys the module's VMs and keeps the bucket."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.train.layout import recovery_key, run_prefix
from tests.integration.test_runs import here, run_config, s3, wait_for
from tests.kit import Kit, remove_kit_home_machines

pytestmark = pytest.mark.e2e

MODULE = """
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

variable "vm_count" {
  type = number
}

variable "name_prefix" {
  type = string
}

variable "ssh_public_key" {
  type = string
}

data "gpukit_bucket" "store" {}

resource "gpukit_vm" "box" {
  for_each = toset([for i in range(var.vm_count) : "${var.name_prefix}-${i + 1}"])

  name           = each.key
  gpu_type       = "none"
  gpu_count      = 0
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
}

output "vms" {
  value = {
    for name, vm in gpukit_vm.box : name => {
      id        = vm.id
      ssh_host  = vm.ssh_host
      ssh_port  = vm.ssh_port
      ssh_user  = vm.ssh_user
      host_key  = ""
      gpu_type  = vm.gpu_type
      gpu_count = vm.gpu_count
    }
  }
}

output "bucket" {
  value = {
    endpoint = data.gpukit_bucket.store.endpoint
    name     = data.gpukit_bucket.store.name
    region   = data.gpukit_bucket.store.region
  }
}
"""


def _kit(root: Path) -> Kit:
    home = root / "kit"
    # The module's VMs share this host's network (the local backend's do): no group firewall rules here.
    (home / "ansible" / "group_vars").mkdir(parents=True)
    (home / "ansible" / "group_vars" / "all.yml").write_text("group_firewall_enabled: false\n")
    return Kit(home=home, env={**os.environ, "GPUKIT_HOME": str(home)})


@pytest.mark.timeout(900)
def test_a_users_module_drives_the_kit(tmp_path: Path) -> None:
    module = tmp_path / "my-infra"
    module.mkdir()
    (module / "main.tf").write_text(MODULE)
    kit, fast = _kit(tmp_path), None
    try:
        t0 = time.monotonic()
        res = kit.glue("up", "--backend", "terraform", "--module", str(module), "--vms", "2", timeout=600)
        print(f"glue up of a user's module, 2 VMs: {time.monotonic() - t0:.1f} s")
        trusted = [ln for ln in res.stderr.splitlines() if "trusted on first use" in ln]
        assert len(trusted) == 2 and all("SHA256:" in ln for ln in trusted), res.stderr
        fast = here(kit)
        vms = {v["name"]: v for v in json.loads(fast.glue("status", "--json").stdout)["vms"]}
        assert sorted(vms) == ["gpukit-1", "gpukit-2"] and all(v["reachable"] for v in vms.values()), vms
        assert {v["backend"] for v in vms.values()} == {"terraform"}
        assert json.loads((kit.home / "cluster.json").read_text())["module"] == str(module)

        cfg = run_config(tmp_path, config={"steps": 60, "step_sleep": 0.1, "checkpoint_interval": 10},
                         checkpoint={"interval_steps": 10})
        kit.glue("deploy", "--run", "mine", "--config", str(cfg), "--vm", "gpukit-2")
        wait_for(fast, "mine", lambda s: (s["step"] or 0) >= 25, timeout=240)
        old = vms["gpukit-2"]["id"]
        LocalBackend(kit.home).delete_vm(old)  # the cloud took the VM away; the module's state still lists it
        t1 = time.monotonic()
        res = kit.glue("recover", "--run", "mine", timeout=600)
        print(f"glue recover through the user's module: {time.monotonic() - t1:.1f} s")
        assert 'module.user.gpukit_vm.box["gpukit-2"]' in res.stderr, res.stderr  # the module's own resource
        record = run_prefix("mine") + recovery_key(1)
        rec = json.loads(s3(fast).get_object(Bucket="gpukit", Key=record)["Body"].read())
        assert rec["verified"] and rec["failure_class"] == "vm_lost", rec
        assert rec["old_vm"]["id"] == old and rec["new_vm"]["id"] != old, rec
        assert rec["first_resumed_step"] == rec["checkpoint_step"] + 1
        pins = json.loads((kit.home / "user-module" / "host_keys.json").read_text())
        assert rec["new_vm"]["id"] in pins and old not in pins, pins  # the new VM's key trusted on first use
        st = wait_for(fast, "mine", lambda s: s["state"] != "running", timeout=300)
        assert st["state"] == "completed", st

        kit.glue("down", timeout=600)
        assert LocalBackend(kit.home).owned_vm_ids() == []
        assert s3(fast).head_object(Bucket="gpukit", Key=record)  # the bucket and its data are kept
    finally:
        if fast is not None:
            kit.glue("down", "--force", check=False)
        remove_kit_home_machines(kit.home)


@pytest.mark.stress  # `make test-all`: make test keeps the drill (tests/e2e/test_report_drill.py) and this module
@pytest.mark.timeout(900)
def test_a_drill_destroys_its_victim_through_the_users_module(tmp_path: Path) -> None:
    """`glue drill` on VMs only terraform may delete: its victim goes by a targeted destroy of the module's
    own resource, and the recovery's apply makes it again; the drill passes as on any backend."""
    module = tmp_path / "my-infra"
    module.mkdir()
    (module / "main.tf").write_text(MODULE)
    kit, fast = _kit(tmp_path), None
    try:
        kit.glue("up", "--backend", "terraform", "--module", str(module), "--vms", "2", timeout=600)
        fast = here(kit)
        before = {v["name"]: v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"]}
        cfg = run_config(tmp_path, config={"steps": 30, "step_sleep": 0.05, "checkpoint_interval": 10},
                         checkpoint={"interval_steps": 10})
        res = kit.glue("drill", "--run", "tfd", "--config", str(cfg), "--kill-at", "15", check=False, timeout=900)
        assert res.returncode == 0 and "PASS" in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr[-3000:]
        said = " ".join(res.stderr.split())
        assert "destroyed VM" in said and 'module.user.gpukit_vm.box["' in said, said  # the module's own resource
        rec = json.loads(s3(fast).get_object(Bucket="gpukit", Key=run_prefix("tfd-drill1") + recovery_key(1))
                         ["Body"].read())
        assert rec["verified"] and rec["failure_class"] == "vm_lost", rec
        assert rec["old_vm"]["id"] in before.values() and rec["new_vm"]["id"] not in before.values(), rec
        assert LocalBackend(kit.home).read_vm(rec["old_vm"]["id"]) is None  # destroyed, not just stopped
        kit.glue("down", timeout=600)
        assert LocalBackend(kit.home).owned_vm_ids() == []
    finally:
        if fast is not None:
            kit.glue("down", "--force", check=False)
        remove_kit_home_machines(kit.home)

"""The gpukit provider under real terraform: create, read, drift on out-of-band loss, delete."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from rich.console import Console

from glue.cloud.local.backend import LocalBackend
from glue.infra.ssh_keys import public_key
from glue.infra.terraform import Terraform

from .conftest import Kit

pytestmark = pytest.mark.integration


def test_create_read_lost_vm_plans_replacement_delete(kit: Kit) -> None:
    tf = Terraform(kit.home, "local", Console(quiet=True))
    variables = {"vm_count": 1, "name_prefix": "prov", "gpu_type": "none", "ssh_public_key": public_key(kit.home)}
    tf.apply(variables)
    vm = tf.outputs()["vms"]["prov-1"]
    assert set(vm) == {"id", "ssh_host", "ssh_port", "ssh_user", "host_key", "gpu_type", "gpu_count", "backend"}
    assert vm["ssh_host"] == "127.0.0.1" and vm["host_key"].startswith("ssh-ed25519 ")
    assert set(tf.outputs()["bucket"]) == {"endpoint", "name", "region"}

    backend = LocalBackend(kit.home)
    rec = backend.read_vm(vm["id"])
    assert rec is not None and rec.status == "running" and rec.ssh_port == vm["ssh_port"]
    assert tf.plan_changes(variables) == []  # a healthy VM: no drift

    # Lose the VM out of band: read reports it gone, so the plan creates it again.
    state = json.loads((kit.home / "vms" / vm["id"] / "state.json").read_text())
    os.kill(state["init_pid"], signal.SIGKILL)
    time.sleep(0.2)
    assert backend.read_vm(vm["id"]) is None
    assert tf.plan_changes(variables) == [('gpukit_vm.node["prov-1"]', "create")]

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

"""Hosts behind a jump host: the record every connection reads, and the inventory Ansible gets from it: the
jump's pinned key in the kit's known_hosts, a ProxyCommand that checks it the same way, and no secret."""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from glue.bucket_access import BucketInfo
from glue.cloud import jumps
from glue.cloud.base import VMRecord
from glue.infra import inventory

JUMP = jumps.Jump("admin", "10.0.0.1", 2200, "/keys/id", "ssh-ed25519 AAAAjump")


def _vm(name: str, vm_id: str, port: int) -> VMRecord:
    return VMRecord(id=vm_id, name=name, ssh_host="10.0.0.5", ssh_port=port, ssh_user="root",
                    host_key=f"ssh-ed25519 AAAA{vm_id}", gpu_type="none", gpu_count=0, backend="ssh", status="running")


def test_the_record_round_trips(tmp_path: Path) -> None:
    assert jumps.read(tmp_path) == {}
    jumps.write(tmp_path, {"box-2": JUMP})
    assert jumps.read(tmp_path) == {"box-2": JUMP}


def test_the_inventory_sends_ansible_through_the_pinned_jump(tmp_path: Path) -> None:
    (tmp_path / "ssh").mkdir()
    jumps.write(tmp_path, {"box-2": JUMP})
    outputs = inventory.outputs_of({"gpukit-1": _vm("gpukit-1", "box-1", 22), "gpukit-2": _vm("gpukit-2", "box-2", 23)},
                                   BucketInfo("http://127.0.0.1:9000", "gpukit", "us-east-1"))
    inventory.write(tmp_path, outputs)
    known = inventory.known_hosts_path(tmp_path).read_text().splitlines()
    assert "[10.0.0.1]:2200 ssh-ed25519 AAAAjump" in known and "[10.0.0.5]:23 ssh-ed25519 AAAAbox-2" in known
    hosts = yaml.safe_load(inventory.inventory_path(tmp_path).read_text())["all"]["hosts"]
    assert "ansible_ssh_common_args" not in hosts["gpukit-1"]  # reached directly: the group's options
    args = shlex.split(hosts["gpukit-2"]["ansible_ssh_common_args"])  # as Ansible's ssh plugin splits them
    assert f"UserKnownHostsFile={inventory.known_hosts_path(tmp_path)}" in args and "StrictHostKeyChecking=yes" in args
    proxy = next(a for a in args if a.startswith("ProxyCommand="))
    command = shlex.split(proxy.removeprefix("ProxyCommand="))
    assert command[:1] == ["ssh"] and command[-3:] == ["-W", "%h:%p", "10.0.0.1"]
    assert ["-p", "2200"] == command[command.index("-p"):command.index("-p") + 2]
    assert "admin" in command and "/keys/id" in command and "StrictHostKeyChecking=yes" in command
    assert f"UserKnownHostsFile={inventory.known_hosts_path(tmp_path)}" in command

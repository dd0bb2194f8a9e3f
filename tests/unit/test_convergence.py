"""Which VMs a `glue up` converges, and why: from the inventory and the record of the last converge."""

from __future__ import annotations

from pathlib import Path

import yaml

from glue.operations import convergence


def _inventory(home: Path, ids: dict[str, str], backend: str = "lyceum") -> None:
    (home / "ansible").mkdir(parents=True, exist_ok=True)
    (home / "bucket").mkdir(exist_ok=True)
    creds = home / "bucket" / "credentials.json"
    if not creds.exists():
        creds.write_text('{"access_key": "a", "secret_key": "s"}')
    hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": 2200 + i, "gpukit_vm_id": vid,
                    "gpukit_backend": backend}
             for i, (name, vid) in enumerate(sorted(ids.items()))}
    inv = {"all": {"hosts": hosts, "vars": {"gpukit_bucket_endpoint": "http://127.0.0.1:9000",
                                            "gpukit_bucket_credentials_file": str(creds)}}}
    (home / "ansible" / "inventory.yml").write_text(yaml.safe_dump(inv))


def test_a_fresh_cluster_converges_every_vm_then_none(tmp_path: Path) -> None:
    _inventory(tmp_path, {"g-1": "a1", "g-2": "b2"})
    now = convergence.vm_parts(tmp_path, "img1")
    assert convergence.reasons(tmp_path, ["g-1", "g-2"], now) == {"g-1": "never configured",
                                                                   "g-2": "never configured"}
    convergence.record_converged(tmp_path, ["g-1", "g-2"], now)
    assert convergence.reasons(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, "img1")) == {}


def test_each_changed_part_is_named(tmp_path: Path) -> None:
    _inventory(tmp_path, {"g-1": "a1", "g-2": "b2"})
    convergence.record_converged(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, "img1"))
    assert convergence.reasons(tmp_path, ["g-1"], convergence.vm_parts(tmp_path, "img2")) == {"g-1": "image changed"}
    (tmp_path / "bucket" / "credentials.json").write_text('{"access_key": "a", "secret_key": "t"}')
    (tmp_path / "ansible" / "group_vars").mkdir()
    (tmp_path / "ansible" / "group_vars" / "all.yml").write_text("x: 1\n")
    assert convergence.reasons(tmp_path, ["g-2"], convergence.vm_parts(tmp_path, "img1")) == {
        "g-2": "group vars, credentials changed"}


def test_a_replaced_vm_is_new_and_its_peers_see_the_group_change(tmp_path: Path) -> None:
    # VM ids that no hex digest can contain: the record holds digests beside the ids.
    _inventory(tmp_path, {"g-1": "vm-old", "g-2": "vm-peer"})
    convergence.record_converged(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, None))
    _inventory(tmp_path, {"g-1": "vm-new", "g-2": "vm-peer"})
    now = convergence.vm_parts(tmp_path, None)
    assert convergence.reasons(tmp_path, ["g-1", "g-2"], now) == {"g-1": "never configured",
                                                                   "g-2": "cluster VMs changed"}
    # A recovery converged the new VM: it is recorded, the old VM's entry is gone.
    convergence.record_converged(tmp_path, ["g-1"], now)
    assert convergence.reasons(tmp_path, ["g-1"], now) == {}
    assert '"vm-old"' not in (tmp_path / "ansible" / "converged.json").read_text()


def test_peers_reconverge_after_a_replacement_only_where_the_group_firewall_is_on(tmp_path: Path) -> None:
    # Local VMs: the group firewall is off by default, so the peer's configuration does not name the VMs.
    _inventory(tmp_path, {"g-1": "vm-old", "g-2": "vm-peer"}, backend="local")
    convergence.record_converged(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, None))
    _inventory(tmp_path, {"g-1": "vm-new", "g-2": "vm-peer"}, backend="local")
    assert convergence.reasons(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, None)) == {
        "g-1": "never configured"}
    # A user who turns it on there: the group's VMs are part of every VM's configuration again.
    (tmp_path / "ansible" / "group_vars").mkdir()
    (tmp_path / "ansible" / "group_vars" / "all.yml").write_text("group_firewall_enabled: true\n")
    convergence.record_converged(tmp_path, ["g-1", "g-2"], convergence.vm_parts(tmp_path, None))
    _inventory(tmp_path, {"g-1": "vm-newer", "g-2": "vm-peer"}, backend="local")
    assert convergence.reasons(tmp_path, ["g-2"], convergence.vm_parts(tmp_path, None)) == {
        "g-2": "cluster VMs changed"}


def test_the_record_of_an_apply_follows_its_inputs(tmp_path: Path) -> None:
    a = convergence.terraform_inputs("local", {"vm_count": 2})
    assert a == convergence.terraform_inputs("local", {"vm_count": 2})
    assert a != convergence.terraform_inputs("local", {"vm_count": 3})
    assert a != convergence.terraform_inputs("qemu", {"vm_count": 2})
    assert convergence.applied(tmp_path) is None
    convergence.record_apply(tmp_path, a)
    assert convergence.applied(tmp_path) == a
    convergence.forget(tmp_path)
    assert convergence.applied(tmp_path) is None

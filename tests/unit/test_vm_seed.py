"""Which converged VM may seed new ones: a seed carries files, not Docker's storage, so a VM whose trainer
runs in an image (built or pulled on the VM) is never captured, and an earlier seed is dropped."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from glue.cluster.current import ClusterConfig
from glue.infra import ansible_verify
from glue.infra.inventory import Host
from glue.operations import converge, vm_seed


def _verified(home: Path, runtime: dict[str, object]) -> None:
    path = ansible_verify.summary_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"checked_at": "now", "seconds": 1.0,
                                "hosts": {"q-1": {"ready": True, "runtime": runtime}}}))


def test_a_vm_whose_trainer_is_a_docker_image_cannot_seed(tmp_path: Path) -> None:
    assert vm_seed.carried_elsewhere(tmp_path, "q-1") is None  # never verified: nothing known against it
    _verified(tmp_path, {"mode": "venv", "ok": True, "image": ""})
    assert vm_seed.carried_elsewhere(tmp_path, "q-1") is None
    _verified(tmp_path, {"mode": "image", "ok": True, "image": "gpukit-trainer:offline"})
    assert vm_seed.carried_elsewhere(tmp_path, "q-1") == "gpukit-trainer:offline"


def test_capture_refuses_an_image_runtime_and_drops_the_earlier_seed(tmp_path: Path) -> None:
    ClusterConfig(backend="qemu", vms=1).save(tmp_path)
    seed = vm_seed.seed_path(tmp_path)
    seed.parent.mkdir(parents=True)
    seed.write_bytes(b"an earlier configuration")
    vm_seed.key_path(tmp_path).write_text("0123456789abcdef\n")
    _verified(tmp_path, {"mode": "image", "ok": True, "image": "gpukit-trainer:offline"})
    out = io.StringIO()
    host = Host(name="q-1", id="q-1-0000", ssh_host="127.0.0.1", ssh_port=1, ssh_user="root", host_key="",
                gpu_type="none", gpu_count=0, backend="qemu")
    converge.capture_seed(tmp_path, Console(file=out, width=300), [host], {})  # no SSH: refused before
    assert "no configuration seed: q-1's trainer runs in the Docker image gpukit-trainer:offline" in out.getvalue()
    assert vm_seed.current_key(tmp_path) is None and not seed.exists()


def _seeded(home: Path, parts: dict[str, str]) -> None:
    vm_seed.seed_path(home).parent.mkdir(parents=True, exist_ok=True)
    vm_seed.seed_path(home).write_bytes(b"a configuration")
    vm_seed.parts_path(home).write_text(json.dumps(parts))
    vm_seed.key_path(home).write_text("0123456789abcdef\n")


def test_after_down_a_seed_is_dropped_when_a_part_known_without_an_inventory_changed(tmp_path: Path) -> None:
    """After `glue down` there is no inventory to hash the bucket from: the roles, group vars, code and image
    are compared, so the next VMs never boot (and are never captured from) an outdated seed."""
    local = {"roles": "r1", "group vars": "", "code": "c1", "image": "i1"}
    _seeded(tmp_path, {**local, "bucket": "b1", "credentials": "k1"})
    vm_seed.forget_stale(tmp_path, local)
    assert vm_seed.current_key(tmp_path) == "0123456789abcdef"  # nothing changed: kept
    vm_seed.forget_stale(tmp_path, {**local, "roles": "r2"})
    assert vm_seed.current_key(tmp_path) is None and not vm_seed.parts_path(tmp_path).exists()
    _seeded(tmp_path, {**local, "bucket": "b1", "credentials": "k1"})
    vm_seed.forget_stale(tmp_path, {**local, "group vars": "g1"})
    assert vm_seed.current_key(tmp_path) is None
    vm_seed.seed_path(tmp_path).write_bytes(b"a seed from before the parts were recorded")
    vm_seed.key_path(tmp_path).write_text("0123456789abcdef\n")
    vm_seed.forget_stale(tmp_path, local)
    assert vm_seed.current_key(tmp_path) is None  # nothing to compare against: not trusted

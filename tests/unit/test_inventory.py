import re
from pathlib import Path

import yaml

from glue.bucket_access import BucketInfo
from glue.infra import inventory

OUTPUTS = {
    "vms": {
        "gpukit-2": {"id": "gpukit-2-b", "ssh_host": "127.0.0.1", "ssh_port": 2202, "ssh_user": "root",
                     "host_key": "ssh-ed25519 BBBB", "gpu_type": "none", "gpu_count": 0, "backend": "local",
                     "market": ""},
        "gpukit-1": {"id": "gpukit-1-a", "ssh_host": "10.0.0.5", "ssh_port": 22, "ssh_user": "root",
                     "host_key": "ssh-ed25519 AAAA", "gpu_type": "h100", "gpu_count": 8, "backend": "lyceum",
                     "market": "spot"},
    },
    "bucket": {"endpoint": "http://127.0.0.1:9000", "name": "gpukit", "region": "local"},
}


def test_inventory_and_known_hosts_from_outputs(tmp_path: Path) -> None:
    hosts = inventory.write(tmp_path, OUTPUTS)
    assert [h.name for h in hosts] == ["gpukit-1", "gpukit-2"]
    kh = inventory.known_hosts_path(tmp_path).read_text().splitlines()
    # Port 22 uses the bare host; other ports the [host]:port form ssh expects.
    assert kh == ["10.0.0.5 ssh-ed25519 AAAA", "[127.0.0.1]:2202 ssh-ed25519 BBBB"]
    inv = yaml.safe_load(inventory.inventory_path(tmp_path).read_text())
    h2 = inv["all"]["hosts"]["gpukit-2"]
    assert (h2["ansible_host"], h2["ansible_port"], h2["ansible_user"]) == ("127.0.0.1", 2202, "root")
    assert inv["all"]["hosts"]["gpukit-1"]["gpukit_gpu_count"] == 8
    v = inv["all"]["vars"]
    assert v["gpukit_bucket_endpoint"] == "http://127.0.0.1:9000"
    assert v["gpukit_bucket_credentials_file"].endswith("bucket/credentials.json")
    assert not any("secret" in k for k in v)
    assert Path(v["ansible_ssh_private_key_file"]).stat().st_mode & 0o077 == 0


def test_kept_vms_stay_trusted_outside_the_inventory(tmp_path: Path) -> None:
    """A VM kept for debugging (--keep-failed) left Terraform's state, but ssh to it must still verify it."""
    hosts = inventory.write(tmp_path, OUTPUTS, also_known=[("127.0.0.1", 2299, "ssh-ed25519 KEPT")])
    assert [h.name for h in hosts] == ["gpukit-1", "gpukit-2"]  # not in the inventory
    kh = inventory.known_hosts_path(tmp_path).read_text().splitlines()
    assert kh[-1] == "[127.0.0.1]:2299 ssh-ed25519 KEPT" and len(kh) == 3
    assert "2299" not in inventory.inventory_path(tmp_path).read_text()


def test_outputs_contract_round_trips_through_one_definition() -> None:
    """hosts_from_outputs reads exactly what outputs_of builds (the test bed's stand-in for Terraform)."""
    hosts = inventory.hosts_from_outputs(OUTPUTS)
    bucket = inventory.bucket_from_outputs(OUTPUTS)
    assert inventory.outputs_of({h.name: h for h in hosts}, bucket) == OUTPUTS
    assert set(inventory.VM_FIELDS) == set(OUTPUTS["vms"]["gpukit-1"])
    assert set(inventory.BUCKET_FIELDS) == set(OUTPUTS["bucket"])
    assert inventory.bucket_from_outputs({}) == BucketInfo(endpoint="", name="", region="")


def test_a_state_written_before_the_market_reads_as_none() -> None:
    vm = {k: v for k, v in OUTPUTS["vms"]["gpukit-1"].items() if k != "market"}
    [h] = inventory.hosts_from_outputs({"vms": {"gpukit-1": vm}})
    assert h.market == ""


def test_terraform_numbers_arrive_as_ints() -> None:
    vm = {**OUTPUTS["vms"]["gpukit-1"], "ssh_port": 22.0, "gpu_count": 8.0}
    [h] = inventory.hosts_from_outputs({"vms": {"gpukit-1": vm}})
    assert (h.ssh_port, h.gpu_count) == (22, 8) and isinstance(h.ssh_port, int)


TERRAFORM = Path(__file__).resolve().parents[2] / "terraform"


def test_terraform_module_emits_the_contract_inventory_reads() -> None:
    """terraform/modules/cluster/outputs.tf states the outputs once; the envs only pass them through."""
    text = (TERRAFORM / "modules" / "cluster" / "outputs.tf").read_text()
    vm_keys = re.findall(r"^\s*(\w+)\s*=\s*vm\.(\w+)\s*$", text, re.MULTILINE)
    bucket_keys = re.findall(r"^\s*(\w+)\s*=\s*data\.gpukit_bucket\.this\.(\w+)\s*$", text, re.MULTILINE)
    assert all(k == attr for k, attr in vm_keys + bucket_keys)
    assert [k for k, _ in vm_keys] == list(inventory.VM_FIELDS)
    assert [k for k, _ in bucket_keys] == list(inventory.BUCKET_FIELDS)
    for env in ("local", "qemu", "lyceum"):
        outputs = (TERRAFORM / "envs" / env / "outputs.tf").read_text()
        assert re.findall(r"value\s*=\s*(\S+)", outputs) == ["module.cluster.vms", "module.cluster.bucket"], env


def test_a_non_root_login_escalates_and_root_does_not(tmp_path: Path) -> None:
    outputs = {**OUTPUTS, "vms": {**OUTPUTS["vms"], "gpukit-1": {**OUTPUTS["vms"]["gpukit-1"], "ssh_user": "ubuntu"}}}
    inventory.write(tmp_path, outputs)
    hosts = yaml.safe_load(inventory.inventory_path(tmp_path).read_text())["all"]["hosts"]
    assert hosts["gpukit-1"]["ansible_user"] == "ubuntu"
    assert (hosts["gpukit-1"]["ansible_become"], hosts["gpukit-1"]["ansible_become_method"]) == (True, "sudo")
    assert "ansible_become" not in hosts["gpukit-2"]  # root: the plays' own `become: false` holds

"""The nvidia_driver role against fact fixtures: package/branch selection for every supported OS,
GPU detection from a fixture PCI tree, and the no-GPU path (skip with a message, never fail).

Each fixture is an inventory host with connection local; its facts are injected with a cacheable
set_fact (so `ansible_facts[...]` sees them) before the role's task files run. One ansible-playbook
run covers all fixtures; results come back through the json stdout callback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
KERNEL = "6.8.0-45-generic"

OS_FIXTURES: dict[str, dict[str, Any]] = {
    "ubuntu2204": {"distribution": "Ubuntu", "distribution_major_version": "22", "distribution_version": "22.04",
                   "distribution_release": "jammy", "os_family": "Debian", "architecture": "x86_64",
                   "kernel": KERNEL, "service_mgr": "systemd"},
    "ubuntu2404": {"distribution": "Ubuntu", "distribution_major_version": "24", "distribution_version": "24.04",
                   "distribution_release": "noble", "os_family": "Debian", "architecture": "x86_64",
                   "kernel": KERNEL, "service_mgr": "systemd"},
    "debian12": {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.7",
                 "distribution_release": "bookworm", "os_family": "Debian", "architecture": "x86_64",
                 "kernel": "6.1.0-25-cloud-amd64", "service_mgr": "systemd"},
    "ubuntu2004": {"distribution": "Ubuntu", "distribution_major_version": "20", "distribution_version": "20.04",
                   "distribution_release": "focal", "os_family": "Debian", "architecture": "x86_64",
                   "kernel": "5.4.0-200-generic", "service_mgr": "systemd"},
    "rocky9": {"distribution": "Rocky", "distribution_major_version": "9", "distribution_version": "9.4",
               "distribution_release": "Blue Onyx", "os_family": "RedHat", "architecture": "x86_64",
               "kernel": "5.14.0-427.el9.x86_64", "service_mgr": "systemd"},
}

# host name -> (OS fixture, role variables)
SELECT_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "u22_default": ("ubuntu2204", {}),
    "u24_default": ("ubuntu2404", {}),
    "u24_prebuilt": ("ubuntu2404", {"nvidia_driver_ubuntu_prebuilt_modules": True}),
    "u22_cuda_repo_550": ("ubuntu2204", {"nvidia_driver_source": "cuda_repo", "nvidia_driver_branch": "550"}),
    "u24_cuda_repo_arm": ("ubuntu2404", {"nvidia_driver_source": "cuda_repo", "fixture_arch": "aarch64"}),
    "u22_fabricmanager": ("ubuntu2204", {"nvidia_driver_fabricmanager": True,
                                         "nvidia_driver_extra_packages": ["nvidia-dcgm"]}),
    "d12_default": ("debian12", {}),
    "d12_580": ("debian12", {"nvidia_driver_branch": "580"}),
    "d12_distro": ("debian12", {"nvidia_driver_source": "distro"}),
    "u20_unsupported": ("ubuntu2004", {}),
    "rocky_unsupported": ("rocky9", {}),
}

PLAYBOOK = """
- name: Inject fact fixtures
  hosts: all
  gather_facts: false
  tasks:
    - name: Set the fixture facts
      ansible.builtin.set_fact:
        cacheable: true
        distribution: "{{ fixture_facts.distribution }}"
        distribution_major_version: "{{ fixture_facts.distribution_major_version }}"
        distribution_version: "{{ fixture_facts.distribution_version }}"
        distribution_release: "{{ fixture_facts.distribution_release }}"
        os_family: "{{ fixture_facts.os_family }}"
        architecture: "{{ fixture_arch | default(fixture_facts.architecture) }}"
        kernel: "{{ fixture_facts.kernel }}"
        service_mgr: "{{ fixture_facts.service_mgr }}"

- name: Run a part of the nvidia_driver role
  hosts: all
  gather_facts: false
  tasks:
    - name: Include the role's task file
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: "{{ fixture_tasks }}"
        public: true
    - name: Report
      ansible.builtin.debug:
        msg:
          packages: "{{ nvidia_driver_packages | default(None) }}"
          repo: "{{ nvidia_driver_cuda_repo_url | default(None) }}"
          source: "{{ nvidia_driver_source }}"
          gpu_present: "{{ nvidia_driver_gpu_present | default(None) }}"
          gpu_pci: "{{ nvidia_driver_gpu_pci | default(None) }}"
          status: "{{ nvidia_driver_status | default(None) }}"
"""


def run_fixtures(tmp: Path, hosts: dict[str, dict[str, Any]], check: bool = False) -> dict[str, dict[str, Any]]:
    """Run PLAYBOOK on fixture hosts; return per host {"failed": msg} or the Report msg."""
    inv = {"all": {"hosts": hosts, "vars": {"ansible_connection": "local",
                                             "ansible_python_interpreter": sys.executable}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inv))
    (tmp / "play.yml").write_text(PLAYBOOK)
    import ansible_runner

    envvars = {"ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
               "ANSIBLE_LOCAL_TEMP": str(tmp / "tmp"), "ANSIBLE_HOME": str(tmp / "ansible-home"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp / "runner").mkdir(exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(tmp / "runner"), playbook=str(tmp / "play.yml"), inventory=str(tmp / "inventory.yml"),
        envvars=envvars, cmdline="--check" if check else None, quiet=True, suppress_env_files=True,
    )
    results: dict[str, dict[str, Any]] = {}
    for event in runner.events:
        data = event.get("event_data") or {}
        host, res = data.get("host"), data.get("res") or {}
        if host in results or not host:
            continue
        if event["event"] == "runner_on_failed":
            results[host] = {"failed": res.get("msg", ""), "task": data.get("task")}
        elif event["event"] == "runner_on_ok" and data.get("task") == "Report":
            results[host] = res["msg"]
    missing = set(hosts) - set(results)
    assert not missing, f"no result for {missing}: {runner.status}\n{runner.stdout.read()}"
    return results


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    hosts = {
        name: {"fixture_facts": OS_FIXTURES[os_name], "fixture_tasks": "select.yml", **role_vars}
        for name, (os_name, role_vars) in SELECT_CASES.items()
    }
    return run_fixtures(tmp_path_factory.mktemp("select"), hosts)


def test_ubuntu_defaults_to_server_headless_packages(selected: dict[str, dict[str, Any]]) -> None:
    for host, release in (("u22_default", "ubuntu2204"), ("u24_default", "ubuntu2404")):
        r = selected[host]
        assert r["source"] == "distro"
        assert r["packages"] == ["nvidia-headless-570-server", f"linux-headers-{KERNEL}", "nvidia-utils-570-server"]
        assert r["repo"].endswith(f"/{release}/x86_64")


def test_ubuntu_prebuilt_modules_for_the_running_kernel(selected: dict[str, dict[str, Any]]) -> None:
    assert selected["u24_prebuilt"]["packages"] == [
        "nvidia-headless-no-dkms-570-server", f"linux-modules-nvidia-570-server-{KERNEL}", "nvidia-utils-570-server"]


def test_ubuntu_cuda_repo_with_branch_and_arch(selected: dict[str, dict[str, Any]]) -> None:
    r = selected["u22_cuda_repo_550"]
    assert r["packages"] == [f"linux-headers-{KERNEL}", "cuda-drivers-550"]
    assert r["repo"] == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"
    assert selected["u24_cuda_repo_arm"]["repo"].endswith("/ubuntu2404/sbsa")


def test_fabricmanager_and_extra_packages(selected: dict[str, dict[str, Any]]) -> None:
    assert selected["u22_fabricmanager"]["packages"][-2:] == ["nvidia-fabricmanager-570", "nvidia-dcgm"]


def test_debian12_uses_the_cuda_repository(selected: dict[str, dict[str, Any]]) -> None:
    r = selected["d12_default"]
    assert r["source"] == "cuda_repo"
    assert r["packages"] == ["linux-headers-6.1.0-25-cloud-amd64", "cuda-drivers-570"]
    assert r["repo"] == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"
    assert selected["d12_580"]["packages"][-1] == "cuda-drivers-580"


def test_debian12_refuses_the_distro_source(selected: dict[str, dict[str, Any]]) -> None:
    r = selected["d12_distro"]
    assert r["task"] == "Fail on a driver source this OS does not offer"
    assert "cuda_repo" in r["failed"]


def test_unsupported_os_fails_clearly(selected: dict[str, dict[str, Any]]) -> None:
    for host, name in (("u20_unsupported", "Ubuntu 20.04"), ("rocky_unsupported", "Rocky 9.4")):
        r = selected[host]
        assert r["task"] == "Fail on an OS the driver role does not support", r
        assert "Ubuntu 22.04, Ubuntu 24.04 and Debian 12" in r["failed"] and name in r["failed"]


def _pci(tmp: Path, devices: dict[str, tuple[str, str]]) -> str:
    root = tmp / "pci"
    for addr, (vendor, klass) in devices.items():
        d = root / addr
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    root.mkdir(exist_ok=True)
    return str(root)


def test_detection_from_pci_vendor_and_class(tmp_path: Path) -> None:
    trees = {
        "two_gpus": _pci(tmp_path / "a", {"0000:00:01.0": ("0x8086", "0x060000"),
                                          "0000:17:00.0": ("0x10de", "0x030200"),
                                          "0000:65:00.0": ("0x10de", "0x030000")}),
        "audio_only": _pci(tmp_path / "b", {"0000:01:00.1": ("0x10de", "0x040300")}),
        "none": _pci(tmp_path / "c", {"0000:00:02.0": ("0x1af4", "0x010000")}),
    }
    hosts = {name: {"fixture_facts": OS_FIXTURES["ubuntu2204"], "fixture_tasks": "detect.yml",
                    "nvidia_driver_pci_devices_dir": path} for name, path in trees.items()}
    r = run_fixtures(tmp_path, hosts)
    assert r["two_gpus"]["gpu_present"] is True
    assert r["two_gpus"]["gpu_pci"] == ["0000:17:00.0", "0000:65:00.0"]
    assert r["two_gpus"]["status"] == "pending"
    for name in ("audio_only", "none"):
        assert r[name]["gpu_present"] is False and r[name]["status"] == "no_gpu"


@pytest.mark.parametrize("check", [True, False])
def test_no_gpu_skips_the_whole_role_without_failing(tmp_path: Path, check: bool) -> None:
    """main.yml on every OS fixture (unsupported ones too) with no GPU: skip, set facts, no failure."""
    pci = _pci(tmp_path, {"0000:00:02.0": ("0x1af4", "0x010000")})
    hosts = {os_name: {"fixture_facts": facts, "fixture_tasks": "main.yml", "nvidia_driver_pci_devices_dir": pci}
             for os_name, facts in OS_FIXTURES.items()}
    r = run_fixtures(tmp_path, hosts, check=check)
    for os_name in OS_FIXTURES:
        assert "failed" not in r[os_name], r[os_name]
        assert r[os_name]["gpu_present"] is False and r[os_name]["status"] == "no_gpu"
        assert r[os_name]["packages"] is None

"""The scheduler's group vars `glue up` writes for the slurm role (glue.cluster.slurm_vars)."""

from __future__ import annotations

from pathlib import Path

import yaml

from glue.cluster import slurm_vars as cluster_vars
from glue.cluster.current import ClusterConfig
from glue.infra.inventory import Host


def host(name: str, address: str = "127.0.0.1", gpus: int = 0) -> Host:
    return Host(name=name, id=f"id-{name}", ssh_host=address, ssh_port=2222, ssh_user="root", host_key="k",
                gpu_type="none" if not gpus else "a100", gpu_count=gpus, backend="local")


def written(home: Path) -> dict[str, object]:
    return yaml.safe_load(cluster_vars.vars_path(home).read_text())


def test_a_cluster_that_never_ran_a_scheduler_gets_no_file(tmp_path: Path) -> None:
    cluster_vars.write(tmp_path, ClusterConfig(vms=2), [host("gpukit-1"), host("gpukit-2")])
    assert not cluster_vars.vars_path(tmp_path).parent.exists()  # its VMs' "group vars" part is unchanged


def test_local_vms_get_ports_of_their_own_kept_across_ups_then_none(tmp_path: Path) -> None:
    cfg = ClusterConfig(vms=2, spares=1, scheduler="slurm")
    hosts = [host("gpukit-1"), host("gpukit-2"), host("gpukit-spare-1")]
    cluster_vars.write(tmp_path, cfg, hosts)
    first = written(tmp_path)
    assert first["gpukit_scheduler"] == "slurm" and first["slurm_head"] == "gpukit-1"
    assert first["slurm_nodes"] == ["gpukit-1", "gpukit-2", "gpukit-spare-1"]
    assert first["slurm_spares"] == ["gpukit-spare-1"] and first["slurm_partition"] == "gpu"
    ports = [first["slurm_ctld_port"], *first["slurm_slurmd_ports"].values()]
    assert len(set(ports)) == 4 and all(20000 <= p < 32000 for p in ports)  # one host network: no two alike
    assert first["slurm_real_gpus"] == {"gpukit-1": 0, "gpukit-2": 0, "gpukit-spare-1": 0}

    cluster_vars.write(tmp_path, cfg, hosts)  # the next `glue up`: the same file, so no VM reconverges
    assert written(tmp_path) == first

    cluster_vars.write(tmp_path, ClusterConfig(vms=2, spares=1, scheduler="none"), hosts)
    assert written(tmp_path) == {"gpukit_scheduler": "none"}  # the role stops Slurm where it ran


def test_vms_of_their_own_use_slurms_ports_and_real_gpus(tmp_path: Path) -> None:
    cfg = ClusterConfig(backend="lyceum", vms=2, scheduler="slurm")
    cluster_vars.write(tmp_path, cfg, [host("gpukit-1", "10.0.0.5", 2), host("gpukit-2", "10.0.0.6", 2)])
    got = written(tmp_path)
    assert got["slurm_ctld_port"] == 6817 and set(got["slurm_slurmd_ports"].values()) == {6818}
    assert got["slurm_node_addresses"] == {"gpukit-1": "10.0.0.5", "gpukit-2": "10.0.0.6"}
    assert got["slurm_real_gpus"] == {"gpukit-1": 2, "gpukit-2": 2}
    assert not (cluster_vars.slurm_dir(tmp_path) / "ports.json").exists()

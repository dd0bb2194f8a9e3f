"""The scheduler's part of the playbook's input, <home>/ansible/group_vars/all/gpukit_scheduler.yml,
written by `glue up` from the cluster config (`--scheduler`), beside the user's group vars (whose hash
is part of every VM's configuration: changing the scheduler converges every VM). ansible/roles/slurm
reads it: the head, the nodes of the partition, the spares held out, and the ports. (Here, below
glue.operations, which writes it; glue.scheduler.slurm, which talks to the running Slurm, sits above.)

Ports: VMs reached on a loopback address share this machine's network (local nspawn VMs: one network
namespace; qemu: forwarded from it), where another kit home's Slurm may run too: slurmctld and each
slurmd get a port of their own, picked free once and kept in <home>/slurm/ports.json. Elsewhere Slurm's
own ports (6817, 6818)."""

from __future__ import annotations

import ipaddress
import json
import random
import socket
from pathlib import Path
from typing import Any

import yaml

from glue.cluster.current import ClusterConfig
from glue.infra.inventory import Host

PARTITION = "gpu"
SPARE_REASON = "gpukit spare"  # the reason a warm spare is drained with until a lost node's place needs it
SLURMCTLD_PORT, SLURMD_PORT = 6817, 6818
_PORT_RANGE = (20000, 32000)  # below Linux's ephemeral range: no outgoing connection takes one meanwhile


def vars_path(home: Path) -> Path:
    return home / "ansible" / "group_vars" / "all" / "gpukit_scheduler.yml"


def slurm_dir(home: Path) -> Path:
    """Where the controller keeps the cluster's Slurm secrets and ports (the munge key: munge.key, 0600)."""
    return home / "slurm"


def _loopback(hosts: list[Host]) -> bool:
    try:
        return any(ipaddress.ip_address(h.ssh_host).is_loopback for h in hosts)
    except ValueError:
        return False  # a DNS name: a VM of its own


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _ports(home: Path, names: list[str]) -> dict[str, int]:
    """{"slurmctld" | node: port}, kept once picked (a replaced VM gets its predecessor's)."""
    path = slurm_dir(home) / "ports.json"
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    ports = {k: v for k, v in kept.items() if type(v) is int} if isinstance(kept, dict) else {}
    for name in ["slurmctld", *names]:
        while name not in ports:
            port = random.randrange(*_PORT_RANGE)
            if port not in ports.values() and _port_free(port):
                ports[name] = port
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(ports, indent=1, sort_keys=True))
    return ports


def settings(home: Path, cfg: ClusterConfig, hosts: list[Host]) -> dict[str, Any]:
    """The variables ansible/roles/slurm takes from glue (its defaults/main.yml documents them)."""
    if cfg.scheduler != "slurm":
        return {"gpukit_scheduler": cfg.scheduler}
    nodes = cfg.vm_names() + cfg.spare_names()
    shared = _loopback(hosts)
    ports = _ports(home, nodes) if shared else {}
    address = {h.name: h.ssh_host for h in hosts}
    gpus = {h.name: h.gpu_count for h in hosts}
    return {
        "gpukit_scheduler": "slurm",
        "slurm_head": cfg.vm_names()[0],
        "slurm_partition": PARTITION,
        "slurm_nodes": nodes,
        "slurm_spares": cfg.spare_names(),
        "slurm_spare_reason": SPARE_REASON,
        "slurm_node_addresses": {n: address.get(n, "127.0.0.1" if shared else n) for n in nodes},
        "slurm_real_gpus": {n: gpus.get(n, 0) for n in nodes},  # 0: none (the role's stand-ins, on test VMs)
        "slurm_ctld_port": ports.get("slurmctld", SLURMCTLD_PORT),
        "slurm_slurmd_ports": {n: ports.get(n, SLURMD_PORT) for n in nodes},
    }


def write(home: Path, cfg: ClusterConfig, hosts: list[Host]) -> None:
    """Before the playbook runs. A cluster that never ran a scheduler gets no file (its configuration, and
    so its converged VMs, stay as they were); one that did gets `gpukit_scheduler: none`, and the slurm role
    stops Slurm there."""
    path = vars_path(home)
    if cfg.scheduler == "none" and not path.exists():
        return
    text = ("# Written by `glue up` (glue/cluster/slurm_vars.py) from the cluster config; "
            "edits are overwritten.\n" + yaml.safe_dump(settings(home, cfg, hosts), sort_keys=True))
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)

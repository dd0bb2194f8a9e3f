"""Slurm on the cluster, by Ansible (`glue up --scheduler slurm`), on local VMs: the nodes idle with their
GPU, the warm spare held out, a test job ran on each node, the munge key secret; then --scheduler none."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.scheduler.slurm import SPARE_REASON, nodes

from .conftest import Kit

pytestmark = pytest.mark.integration

UP_TIMEOUT_S = 1200  # three VMs converged on a 2-core host shared with other tests


def on_vm(home: Path, name: str, command: str) -> str:
    [host] = [h for h in current.all_hosts(home) if h.name == name]
    res = ssh.run(home, host, command, timeout=60)
    assert res.exit_code == 0, f"{name}: {command}: {res.stdout}{res.stderr}"
    return res.stdout


def leaks(home: Path, key: Path, secret: bytes, texts: list[str]) -> list[str]:
    """Where the munge key's bytes (raw, base64, hex, or its first 32 bytes) appear: the kit home's files
    other than the key itself (terraform state, inventory, group vars, Ansible's logs and artifacts; the
    local VMs' disks, whose one copy belongs in /etc/munge) and `texts` (commands' output, process lists)."""
    needles = [secret, secret[:32], base64.b64encode(secret), base64.b64encode(secret[:48]), secret.hex().encode()]
    found = [f"file {p}" for p in home.rglob("*")
             if p.is_file() and not p.is_symlink() and p != key and p.stat().st_size < 200_000_000
             and not (p.is_relative_to(home / "vms") and p.as_posix().endswith("/disk/upper/etc/munge/munge.key"))
             and any(n in p.read_bytes() for n in needles)]
    return found + [f"text {i}" for i, t in enumerate(texts) if any(n.decode("latin-1") in t for n in needles)]


def verified_with_the_key_secret(home: Path, nodes: tuple[str, ...], spares: tuple[str, ...],
                                 texts: list[str]) -> tuple[Path, bytes]:
    """What `glue up --scheduler slurm` leaves: verify.yml ran a one-second job asking for a GPU on each node
    (slurmctld allocated one there) and recorded every VM ready with its Slurm check; a job gets the GPU Slurm
    allocated to it; the munge key made once in the kit home (0600), 0400 munge:munge on every VM, and in no
    other file, process or text. Returns the key's path and bytes."""
    checks = json.loads((home / "ansible" / "verify.json").read_text())["hosts"]
    assert {h: (c["ready"], c["scheduler"]["ok"]) for h, c in checks.items()} == {
        h: (True, True) for h in (*nodes, *spares)}
    log = on_vm(home, nodes[0], "cat /var/log/slurm/slurmctld.log")
    for name in nodes:
        assert f"NodeList={name} " in log, f"no job was allocated on {name}"
    assert on_vm(home, nodes[0], f"srun -N1 -w {nodes[1]} --gres=gpu:1 printenv CUDA_VISIBLE_DEVICES").strip() == "0"
    # The image bakes Slurm and munge: nothing came from a package archive (gpukit's VMs reach none), so apt's
    # lists, empty in the image, are still empty.
    assert on_vm(home, nodes[0], "ls /var/lib/apt/lists | grep -c _Packages || true").strip() == "0"
    key = home / "slurm" / "munge.key"
    secret = key.read_bytes()
    assert len(secret) == 1024 and key.stat().st_mode & 0o777 == 0o600
    processes = []
    for name in (*nodes, *spares):
        mode, encoded = on_vm(home, name, "stat -c '%a %U:%G' /etc/munge/munge.key; base64 -w0 /etc/munge/munge.key"
                              ).splitlines()
        assert mode == "400 munge:munge" and base64.b64decode(encoded) == secret, name
        processes.append(on_vm(home, name, "ps -eo args"))
    processes.append(os.popen("ps -eo args").read())
    assert leaks(home, key, secret, [*texts, *processes]) == []
    return key, secret


# `stress` (make test-all, since 2026-12-07: the suite's time): make test checks the cluster `glue up` made (nodes,
# spare, test jobs, munge key) on tests/e2e/test_slurm_runs.py's cluster; this adds a node whose slurmd died
# converged again and `--scheduler none`, on a cluster of its own.
@pytest.mark.stress
def test_slurm_cluster_up_with_a_drained_spare_then_none(kit: Kit) -> None:
    up = kit.glue("up", "--vms", "2", "--spares", "1", "--scheduler", "slurm", timeout=UP_TIMEOUT_S)
    home = kit.home
    assert json.loads((home / "cluster.json").read_text())["scheduler"] == "slurm"
    assert nodes.head(home).name == "gpukit-1"

    # Every node of the partition idle with its (stand-in) GPU; the spare a node too, drained.
    states = {n.name: n for n in nodes.node_states(home)}
    assert sorted(states) == ["gpukit-1", "gpukit-2", "gpukit-spare-1"], states
    for name in ("gpukit-1", "gpukit-2"):
        assert (states[name].state, states[name].gres) == ("idle", "gpu:1"), states[name]
    assert (states["gpukit-spare-1"].state, states["gpukit-spare-1"].reason) == ("drained", SPARE_REASON)
    assert nodes.gpus_total_and_used(home) == (2, 0)

    # verify.yml ran a one-second job asking for a GPU on each node (slurmctld allocated one there) and
    # recorded every VM ready with its Slurm check.
    key, secret = verified_with_the_key_secret(home, ("gpukit-1", "gpukit-2"), ("gpukit-spare-1",),
                                               [up.stdout + up.stderr])

    # A node whose slurmd died is converged again by the next `glue up` (its live check) and back in service.
    on_vm(home, "gpukit-2", "systemctl stop slurmd")
    again = kit.glue("up", timeout=UP_TIMEOUT_S)
    assert "converging gpukit-2:" in again.stderr, again.stderr
    assert {n.name: n.state for n in nodes.node_states(home)}["gpukit-2"] == "idle"

    # --scheduler none: the role stops Slurm everywhere; the cluster has no head any more.
    kit.glue("up", "--scheduler", "none", timeout=UP_TIMEOUT_S)
    assert json.loads((home / "cluster.json").read_text())["scheduler"] == "none"
    for name in ("gpukit-1", "gpukit-2", "gpukit-spare-1"):
        said = on_vm(home, name, "systemctl is-active slurmd slurmctld munge || true").split()
        assert said == ["inactive"] * 3, (name, said)
    with pytest.raises(GlueError, match="runs no scheduler"):
        nodes.head(home)
    assert key.read_bytes() == secret  # kept: `glue up --scheduler slurm` again takes the same key


@pytest.mark.stress
def test_a_lost_node_requeues_its_job_and_returns_to_service(kit: Kit) -> None:
    """make test-all: the job of a node whose VM died is requeued in tens of seconds; the VM `glue up`
    creates under the same name registers, is back in service and runs the job."""
    kit.glue("up", "--vms", "2", "--scheduler", "slurm", timeout=UP_TIMEOUT_S)
    home = kit.home
    on_vm(home, "gpukit-1", "sbatch --requeue -w gpukit-2 --gres=gpu:1 -J held --wrap 'sleep 600'")
    deadline = time.monotonic() + 60
    while "gpukit-2" not in on_vm(home, "gpukit-1", "squeue -h -t R -o %N"):
        assert time.monotonic() < deadline, "the job never started on gpukit-2"
        time.sleep(1)
    [lost] = [h for h in current.hosts(home) if h.name == "gpukit-2"]
    [state] = [json.loads(p.read_text()) for p in (home / "vms").glob("*/state.json")
               if json.loads(p.read_text())["id"] == lost.id]
    os.kill(int(state["init_pid"]), signal.SIGKILL)
    backend = LocalBackend(home)
    while backend.read_vm(lost.id) is not None:
        time.sleep(0.5)
    # SlurmdTimeout=20: down and requeued well within two minutes (a budget, not a timing assert).
    deadline = time.monotonic() + 120
    while on_vm(home, "gpukit-1", "squeue -h -n held -o %T").strip() != "PENDING":
        assert time.monotonic() < deadline, "the lost node's job was not requeued within 120 s"
        time.sleep(2)
    kit.glue("up", timeout=UP_TIMEOUT_S)
    states = {n.name: n for n in nodes.node_states(home)}
    assert states["gpukit-2"].in_service, states["gpukit-2"]
    # Slurm holds a requeued job back for a while (its BeginTime, ~2 min in 22.05): a budget, not a timing.
    deadline = time.monotonic() + 300
    while on_vm(home, "gpukit-1", "squeue -h -n held -o %T:%N").strip() != "RUNNING:gpukit-2":
        assert time.monotonic() < deadline, "the requeued job did not start on the returned node"
        time.sleep(1)

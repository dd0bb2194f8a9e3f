"""Slurm's nodes as slurmctld sees them, asked on the head over SSH (as root, through glue.infra.ssh):
their states, GPUs in use, and the two changes glue makes (drain, resume)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.scheduler.slurm import PARTITION

COMMAND_TIMEOUT_S = 30  # each Slurm client below gives up after TIMEOUT_S; SSH waits a little longer
TIMEOUT_S = 20
_OUT_OF_SERVICE = ("down", "drain", "fail", "maint", "future", "unknown", "inval", "not_responding")
_GPUS = re.compile(r"\bgpu(?::[^:,(]+)?:(\d+)")  # gpu:2, gpu:a100:2, gpu:1(IDX:0)
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class NodeState:
    """One line of `sinfo -N`: the node, its state as sinfo's long form says it (idle, allocated, mixed,
    drained, down*, ...: a trailing * means slurmctld cannot reach its slurmd), its configured GRES
    (gpu:1) and the reason it was drained or marked down ("" when none)."""

    name: str
    state: str
    gres: str
    reason: str

    @property
    def in_service(self) -> bool:
        """Jobs may start on it: not down, drained, draining or otherwise held out."""
        return not any(word in self.state for word in _OUT_OF_SERVICE) and not self.state.endswith("*")


def head(home: Path) -> Host:
    """The VM slurmctld runs on: the cluster's first VM (<prefix>-1)."""
    cfg = current.ClusterConfig.load(home)
    if cfg.scheduler != "slurm":
        raise GlueError("this cluster runs no scheduler (`glue up --scheduler slurm` sets Slurm up)")
    name = cfg.vm_names()[0]
    found = [h for h in current.hosts(home) if h.name == name]
    if not found:
        raise GlueError(f"the Slurm head {name} is not in the cluster; run `glue up` to reconverge")
    return found[0]


def _ask(home: Path, command: str) -> str:
    """`command` (Slurm clients) on the head; its stdout. slurmctld not answering is one clear error."""
    host = head(home)
    try:
        res = ssh.run(home, host, command, timeout=COMMAND_TIMEOUT_S)
    except GlueError as exc:
        raise GlueError(f"slurmctld on {host.name} does not answer: {exc}; run `glue up` to reconverge") from None
    if res.exit_code != 0:
        said = (res.stderr.strip() or res.stdout.strip() or f"exit {res.exit_code}").splitlines()[-1]
        raise GlueError(f"slurmctld on {host.name} does not answer: {said}; run `glue up` to reconverge")
    return res.stdout


def parse_sinfo(text: str) -> list[NodeState]:
    """`sinfo -N -h -o %N|%T|%G|%E` -> one NodeState per node (a node in several partitions once)."""
    seen: dict[str, NodeState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|", 3)
        if len(fields) != 4 or fields[0] in seen:
            continue
        name, state, gres, reason = fields
        seen[name] = NodeState(name, state.lower(), "" if gres == "(null)" else gres,
                               "" if reason == "none" else reason)
    return sorted(seen.values(), key=lambda n: n.name)


def node_states(home: Path) -> list[NodeState]:
    """Every node of the cluster's Slurm, spares (drained) included."""
    return parse_sinfo(_ask(home, f"timeout {TIMEOUT_S} sinfo -N -h -o '%N|%T|%G|%E'"))


def _check_node(name: str) -> None:
    if not _NODE_NAME.match(name):
        raise GlueError(f"{name!r} is not a Slurm node name (a VM's name, e.g. gpukit-1)")


def resume(home: Path, name: str) -> None:
    """Put the node back into service (after a drain, or when it registered again after it was lost)."""
    _check_node(name)
    _ask(home, f"timeout {TIMEOUT_S} scontrol update nodename={name} state=resume")


def drain(home: Path, name: str, reason: str) -> None:
    """Hold the node out: running jobs finish, no new job starts there."""
    _check_node(name)
    if not reason.strip():
        raise GlueError("a drain needs a reason (Slurm shows it in sinfo)")
    _ask(home, f"timeout {TIMEOUT_S} scontrol update nodename={name} state=drain reason={shlex.quote(reason)}")


def _gpus(gres: str) -> int:
    return sum(int(n) for n in _GPUS.findall(gres))


def parse_gpus(text: str) -> tuple[int, int]:
    """`sinfo -N -h -O NodeList,StateLong,Gres,GresUsed` (each field ended by |) -> (GPUs of the nodes in
    service, GPUs allocated to jobs on any node)."""
    total = used = 0
    seen: set[str] = set()
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 4 or fields[0] in seen:
            continue
        seen.add(fields[0])
        node = NodeState(fields[0], fields[1].lower(), fields[2], "")
        total += _gpus(node.gres) if node.in_service else 0
        used += _gpus(fields[3])
    return total, used


def gpus_total_and_used(home: Path) -> tuple[int, int]:
    """(GPUs on the nodes in service, GPUs allocated now): the cluster's GPUs in use and free."""
    fields = ",".join(f"{name}:200|" for name in ("NodeList", "StateLong", "Gres", "GresUsed"))
    return parse_gpus(_ask(home, f"timeout {TIMEOUT_S} sinfo -N -h -O '{fields}'"))


__all__ = ["PARTITION", "NodeState", "drain", "gpus_total_and_used", "head", "node_states", "resume"]

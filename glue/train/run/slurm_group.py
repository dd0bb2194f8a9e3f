"""A multi-node Slurm job's group, as each of its nodes learns it from the allocation: `srun` starts one task
per node (glue.train.run.slurm_job), and each task runs its node's torchrun agent under the supervisor.

The nodes, in order, are the job's node list (`scontrol show hostnames`); node 0, where the batch script runs,
hosts the rendezvous. Each name resolves to the address the slurm role gave it (/etc/hosts on every node). The
rendezvous port is picked free on node 0 by the batch script (`python -m glue.train.run.slurm_group port`)
before `srun`, and reaches every task in its environment (GPUKIT_SLURM_RDZV_PORT).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass

from glue.train import trainer_vars as V
from glue.train.run.ports import below_ephemeral
from glue.train.run.torchrun import GroupShape, Rendezvous, iface_of

RDZV_PORT = V.SLURM_RDZV_PORT


class GroupError(RuntimeError):
    """This node cannot take its place in the group; the message is the one line to show."""


def resolve(name: str) -> str:
    """A node's IPv4 address by its name."""
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError) as exc:
        raise GroupError(f"node {name} does not resolve ({exc}); `glue up` writes every node's name into "
                         "/etc/hosts") from exc


def hostnames(nodelist: str) -> list[str]:
    """The job's nodes in order (gpukit-[1-2] -> gpukit-1, gpukit-2), as Slurm expands its node list."""
    res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
    names = res.stdout.split()
    if res.returncode != 0 or not names:
        raise GroupError(f"scontrol show hostnames {nodelist} failed: {res.stderr.strip() or 'no output'}")
    return names


@dataclass(frozen=True)
class JobGroup:
    """This node's place in the job's group."""

    shape: GroupShape
    nodes: tuple[str, ...]
    index: int  # SLURM_NODEID: this node's position in `nodes`
    port: int

    @classmethod
    def of(cls, nodelist: str, index: int, port: int | None, procs_per_node: int) -> JobGroup:
        if port is None:
            raise GroupError(f"{RDZV_PORT} is not set: the batch script picks the rendezvous port before srun")
        nodes = tuple(hostnames(nodelist))
        return cls(shape=GroupShape(nodes=len(nodes), procs_per_node=procs_per_node), nodes=nodes, index=index,
                   port=port)

    def rendezvous(self) -> Rendezvous:
        """Where the group meets: node 0's address and the port; each node's own address, and this node's
        interface (the others' are theirs to know)."""
        addrs = tuple(resolve(n) for n in self.nodes)
        own = iface_of(addrs[self.index])
        ifaces = tuple((own if own != "-" else None) if i == self.index else None for i in range(len(addrs)))
        return Rendezvous(host=addrs[0], port=self.port, node_addrs=addrs, node_ifaces=ifaces)


def free_port(name: str) -> int:
    """A free TCP port on `name`'s address (node 0's, where the store is served), below the ephemeral range:
    the batch script picks it before srun starts the node that binds it (glue.train.run.ports)."""
    return below_ephemeral(resolve(name))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "port":
        print("usage: python -m glue.train.run.slurm_group port NODE_NAME", file=sys.stderr)
        return 2
    try:
        print(free_port(argv[1]))
    except (GroupError, OSError) as exc:
        print(f"gpukit: no rendezvous port on {argv[1]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

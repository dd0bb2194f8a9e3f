"""A node's place in a multi-node group: where the group meets (Rendezvous), the group's shape, and the torchrun
command line and environment each node runs.

The controller builds them for a group of VMs (glue.runs.vm_group, addresses probed over SSH); a Slurm job's
node builds its own from the allocation (glue.train.run.slurm_job). Either way node 0 (the head) hosts the c10d
rendezvous store, bound to its address towards the group (glue.train.run.process_group); every node runs
`torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --max-restarts=R` under its own supervisor, and
torchrun restarts all workers of the group together when one fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from glue.train.run.ports import below_ephemeral


@dataclass(frozen=True)
class GroupShape:
    """How many nodes, processes per node, and torchrun's restarts and rendezvous timeout."""

    nodes: int = 1
    procs_per_node: int = 1
    max_restarts: int = 0
    rdzv_timeout_s: int = 300

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class Rendezvous:
    host: str       # the head's address as the other nodes reach it
    port: int
    node_addrs: tuple[str, ...]  # each node's own address towards the group (torchrun --local-addr)
    node_ifaces: tuple[str | None, ...] = ()  # the interface holding it (GLOO/NCCL_SOCKET_IFNAME)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def iface_of(addr: str) -> str:
    """The interface holding `addr` ("-" when `ip` cannot tell). Self-contained, as address_towards."""
    import subprocess

    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    except OSError:
        out = ""
    return next((f[1] for f in map(str.split, out.splitlines()) if len(f) > 3 and f[3].split("/")[0] == addr), "-")


def address_towards(peer: str) -> tuple[str, int, str]:
    """This machine's address towards `peer` (a UDP connect routes, it sends nothing), a free TCP port on it
    below the ephemeral range (glue.train.run.ports), and the interface holding it. Self-contained (its
    imports inside, iface_of and below_ephemeral beside it): glue runs their source on VMs whose python has
    no gpukit (glue.runs.vm_group)."""
    import socket

    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.connect((peer, 9))
    addr = u.getsockname()[0]
    u.close()
    return addr, below_ephemeral(addr), iface_of(addr)


def node_env(rdzv: Rendezvous, node: int) -> dict[str, str]:
    """Environment of node `node`'s torchrun agent."""
    # The rendezvous' shared TCPStore outlives a torchrun restart, and the restarted workers' process group
    # would read the dead workers' gloo addresses from it ("Connection refused"). Without sharing, each
    # round's rank 0 hosts a fresh store.
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    iface = rdzv.node_ifaces[node] if node < len(rdzv.node_ifaces) else None
    if iface:
        env.update(GLOO_SOCKET_IFNAME=iface, NCCL_SOCKET_IFNAME=iface)
    return env


def torchrun_argv(python: str, argv: list[str], shape: GroupShape, rdzv: Rendezvous, node: int, run: str,
                  attempt: int) -> list[str]:
    """The user's command under torchrun on node `node`.

    torch's own rendezvous host would listen on every interface of the head, unauthenticated. Instead
    the head runs torchrun's agent under glue.train.run.process_group, which serves the store bound to
    the group's address only (loopback on the local backend); every agent, the head's too, is a client.
    Every node's agent runs under it, since any of them may be the round's rank 0 that picks the worker
    store's port: there it is picked below the ephemeral range.
    """
    host = [f"--host-store={rdzv.endpoint}"] if node == 0 else []
    launcher = [
        python, "-m", "glue.train.run.process_group", *host, "--",
        f"--nnodes={shape.nodes}", f"--nproc-per-node={shape.procs_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}", f"--rdzv-id={run}-{attempt}",
        f"--rdzv-conf=is_host=0,join_timeout={shape.rdzv_timeout_s}",
        f"--max-restarts={shape.max_restarts}", f"--local-addr={rdzv.node_addrs[node]}",
        "--monitor-interval=1",
    ]
    if len(argv) >= 3 and argv[0].endswith(("python", "python3")) and argv[1] == "-m":
        return [*launcher, "-m", *argv[2:]]
    if len(argv) >= 2 and argv[0].endswith(("python", "python3")):
        return [*launcher, *argv[1:]]
    return [*launcher, "--no-python", *argv]

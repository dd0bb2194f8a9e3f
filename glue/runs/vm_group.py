"""A multi-VM run: which VMs form the group, where they meet, and the torchrun command each one runs.

Node 0 (the head) hosts the c10d rendezvous store, bound to its address towards the group (see
glue.train.run.process_group); glue picks that address and a free port on it.
Every node runs `torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --max-restarts=R` under
its own supervisor; torchrun restarts all workers of the group together when one fails, and the
restarted workers resume from the last valid checkpoint (TORCHELASTIC_RESTART_COUNT > 0).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host

# Run on a VM: the address this VM uses to reach `peer` (a UDP connect routes, it sends nothing), a free
# TCP port on it, and the interface holding it (gloo/nccl bind there instead of resolving the hostname).
_ADDRESS_PROBE = """
import socket, subprocess, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((sys.argv[1], 9))
a = u.getsockname()[0]
t = socket.socket()
t.bind((a, 0))
try:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
except OSError:
    out = ""
iface = next((f[1] for f in map(str.split, out.splitlines()) if len(f) > 3 and f[3].split("/")[0] == a), "-")
print(a, t.getsockname()[1], iface)
"""


@dataclass(frozen=True)
class GroupSpec:
    """The shape of a distributed run, recorded in the manifest so recovery re-forms the same group."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> GroupSpec:
        raw = manifest.get("distributed") or {}
        return cls(**{k: int(v) for k, v in raw.items() if k in cls.__dataclass_fields__})

    def check(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise GlueError("--nodes and --procs-per-node must be >= 1")
        if self.max_restarts < 0:
            raise GlueError("--max-restarts must be >= 0")


@dataclass(frozen=True)
class Rendezvous:
    host: str       # the head's address as the other nodes reach it
    port: int
    node_addrs: tuple[str, ...]  # each node's own address towards the group (torchrun --local-addr)
    node_ifaces: tuple[str | None, ...] = ()  # the interface holding it (GLOO/NCCL_SOCKET_IFNAME)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def pick_hosts(home: Path, vm: str | None, nodes: int) -> list[Host]:
    """One VM (--vm or the first) for a single-node run; the first N VMs (name order) for N nodes."""
    why_not = current.backend(home).multi_node if nodes > 1 else None
    if why_not:
        raise GlueError(f"--nodes {nodes}: {why_not}; run on one VM (--nodes 1, with --procs-per-node G for its "
                        "GPUs), or on a backend whose VMs reach each other (local)")
    hosts = current.hosts(home)
    if not hosts:
        raise GlueError("no VMs in the cluster; run `glue up` first")
    if nodes == 1:
        return [current.host(home, vm) if vm else hosts[0]]
    if vm:
        raise GlueError("--vm picks the VM of a single-node run; a run with --nodes N uses the first N VMs")
    if len(hosts) < nodes:
        raise GlueError(f"--nodes {nodes} needs {nodes} VMs but the cluster has {len(hosts)}; "
                        f"run `glue up --vms {nodes}`")
    return hosts[:nodes]


def rendezvous(home: Path, hosts: list[Host], python: list[str]) -> Rendezvous:
    """Probe each node for its address towards the head (the head: towards node 1, or itself when alone)
    and a free port on the head."""
    addrs: list[str] = []
    ifaces: list[str | None] = []
    port = 0
    for i, host in enumerate(hosts):
        peer = hosts[1] if i == 0 and len(hosts) > 1 else hosts[0]  # one VM, G processes: itself
        cmd = f"{shlex.quote(python[i])} -c {shlex.quote(_ADDRESS_PROBE)} {shlex.quote(peer.ssh_host)}"
        res = ssh.run(home, host, cmd, timeout=60)
        parts = res.stdout.split()
        if res.exit_code != 0 or len(parts) != 3:
            raise GlueError(f"{host.name}: cannot find its address towards {peer.name} for the rendezvous "
                            f"({(res.stderr.strip().splitlines() or ['no output'])[-1]})")
        addrs.append(parts[0])
        ifaces.append(None if parts[2] == "-" else parts[2])
        if i == 0:
            port = int(parts[1])
    return Rendezvous(host=addrs[0], port=port, node_addrs=tuple(addrs), node_ifaces=tuple(ifaces))


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


def torchrun_argv(python: str, argv: list[str], spec: GroupSpec, rdzv: Rendezvous, node: int, run: str,
                  attempt: int) -> list[str]:
    """The user's command under torchrun on node `node`.

    torch's own rendezvous host would listen on every interface of the head, unauthenticated. Instead
    the head runs torchrun's agent under glue.train.run.process_group, which serves the store bound to
    the group's address only (loopback on the local backend); every agent, the head's too, is a client.
    """
    host = [python, "-m", "glue.train.run.process_group", f"--host-store={rdzv.endpoint}", "--"]
    launcher = [
        *(host if node == 0 else [python, "-m", "torch.distributed.run"]),
        f"--nnodes={spec.nodes}", f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}", f"--rdzv-id={run}-{attempt}",
        f"--rdzv-conf=is_host=0,join_timeout={spec.rdzv_timeout_s}",
        f"--max-restarts={spec.max_restarts}", f"--local-addr={rdzv.node_addrs[node]}",
        "--monitor-interval=1",
    ]
    if len(argv) >= 3 and argv[0].endswith(("python", "python3")) and argv[1] == "-m":
        return [*launcher, "-m", *argv[2:]]
    if len(argv) >= 2 and argv[0].endswith(("python", "python3")):
        return [*launcher, *argv[1:]]
    return [*launcher, "--no-python", *argv]

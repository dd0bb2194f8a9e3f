"""A multi-VM run: which VMs form the group and where they meet (the torchrun command each node runs:
glue.train.run.torchrun).

Node 0 (the head) hosts the c10d rendezvous store, bound to its address towards the group (see
glue.train.run.process_group); glue probes that address and a free port on it over SSH. torchrun restarts
all workers of the group together when one fails, and the restarted workers resume from the last valid
checkpoint (TORCHELASTIC_RESTART_COUNT > 0).
"""

from __future__ import annotations

import inspect
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import occupancy
from glue.runs.records import Manifest
from glue.train.run.ports import below_ephemeral
from glue.train.run.torchrun import GroupShape, Rendezvous, address_towards, iface_of

# Run on a VM (by the run's python, which may have no gpukit): prints address_towards(peer).
_ADDRESS_PROBE = (inspect.getsource(below_ephemeral) + inspect.getsource(iface_of) + inspect.getsource(address_towards)
                  + "\nimport sys\nprint(*address_towards(sys.argv[1]))\n")


@dataclass(frozen=True)
class GroupSpec(GroupShape):
    """The shape of a distributed run, recorded in the manifest so recovery re-forms the same group."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> GroupSpec:
        raw = manifest.distributed or {}
        return cls(**{k: int(v) for k, v in raw.items() if k in cls.__dataclass_fields__})

    def check(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise GlueError("--nodes and --procs-per-node must be >= 1")
        if self.max_restarts < 0:
            raise GlueError("--max-restarts must be >= 0")


@dataclass(frozen=True)
class Placement:
    """The hosts a run starts on, and the live runs it shares them with (only where --vm asked for it)."""

    hosts: list[Host]
    shared: str = ""  # 'gpukit-1 (run a)': the busy VMs --vm chose, for the deploy's one line

    @property
    def names(self) -> str:
        return ", ".join(h.name for h in self.hosts)


def pick_hosts(home: Path, vm: str | None, nodes: int, run: str | None = None) -> Placement:
    """A free VM (no live run of another id on it; name order) for a single-node run, or the VM --vm names,
    busy or not (the user shares it on purpose); the first N free VMs for N nodes, or the N that --vm
    names. Refuses in one line when too few are free. `run`: the run being placed (its own earlier attempt
    does not occupy a VM)."""
    why_not = current.backend(home).multi_node if nodes > 1 else None
    if why_not:
        raise GlueError(f"--nodes {nodes}: {why_not}; run on one VM (--nodes 1, with --procs-per-node G for its "
                        "GPUs), or on a backend whose VMs reach each other (local)")
    hosts = current.hosts(home)
    if not hosts:
        raise GlueError("no VMs in the cluster; run `glue up` first")
    if len(hosts) < nodes:
        raise GlueError(f"--nodes {nodes} needs {nodes} VMs but the cluster has {len(hosts)}; "
                        f"run `glue up --vms {nodes}`")
    chosen = [current.host(home, name) for name in _named(vm, nodes)] if vm else hosts
    return choose(chosen, occupancy.live_on(home, chosen, exclude=run), vm, nodes)


def _named(vm: str, nodes: int) -> list[str]:
    """--vm NAME for one node; --vm A,B,.. (node order) for a group of that many distinct VMs."""
    names = [n.strip() for n in vm.split(",") if n.strip()]
    if len(names) != nodes or len(set(names)) != nodes:
        if nodes == 1:
            raise GlueError(f"--vm {vm}: a single-node run names one VM; for a group add --nodes {len(names)}")
        raise GlueError(f"--vm {vm}: a run with --nodes {nodes} names its {nodes} distinct VMs, comma-separated in "
                        f"node order (--vm gpukit-1,gpukit-2), or leave --vm out for the first {nodes} free VMs")
    return names


def choose(hosts: list[Host], occ: occupancy.Occupancy, vm: str | None, nodes: int) -> Placement:
    """The placement rule on what is known: --vm is taken as asked (noting whom it shares with); otherwise
    the first `nodes` free VMs in name order, or one line naming the busy VMs and the ways out."""
    if vm:
        return Placement(hosts, occ.describe([h.name for h in hosts]))
    ordered = sorted(hosts, key=lambda h: name_order(h.name))
    free = occ.free(ordered)
    if len(free) >= nodes:
        return Placement(free[:nodes])
    busy = occ.describe([h.name for h in ordered])
    need = f"only {len(free)} of the {nodes} free VMs this run needs" if nodes > 1 else "no free VM for this run"
    share = "" if nodes > 1 else "`--vm NAME` to share one on purpose, "
    raise GlueError(f"{need}, live runs use {busy}: {share}`glue up --vms "
                    f"{len(hosts) - len(free) + nodes}` for more VMs, or wait for a run to end (`glue stop --run ID` "
                    "ends one)")


def name_order(name: str) -> tuple[str, int]:
    """gpukit-2 before gpukit-10."""
    prefix, _, index = name.rpartition("-")
    return (prefix, int(index)) if index.isdigit() else (name, 0)


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

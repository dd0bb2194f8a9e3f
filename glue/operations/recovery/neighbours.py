"""A single-node run recovered while another live run shares its VM: that VM is neither replaced nor
reconfigured (Terraform's -replace or the playbook would kill or disturb the neighbour); the run moves
to a free VM of the cluster instead, or the recovery refuses in one line before anything is stopped."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from glue.cluster import current
from glue.errors import GlueError, NoCapacity
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import occupancy
from glue.runs.records import AttemptNode
from glue.runs.store import RunStore
from glue.runs.vm_group import name_order


def elsewhere(home: Path, store: RunStore, console: Console, nodes: list[AttemptNode], same_vm: bool,
              keep_failed: bool) -> Host | None:
    """The free VM the run moves to when its VM is alive and used by other live runs; None when the usual
    path (replace the VM, or re-create a lost one) harms no one: a group (it keeps its live VMs), a lost VM
    or one that answers nothing (whatever ran there is lost alike), a VM only this run used."""
    if len(nodes) != 1:
        return None
    host = current.host_of_node(home, nodes[0])
    if host is None or current.backend(home).read_vm(host.id) is None or not ssh.reachable(home, host):
        return None  # lost (or frozen: it answers nothing) for every run on it alike
    others = occupancy.live_on(home, [host], exclude=store.run).busy(host.name)
    if not others:
        return None
    theirs = f"{'run' if len(others) == 1 else 'runs'} {', '.join(others)}"
    if same_vm:
        raise GlueError(f"--same-vm: {host.name} also runs live {theirs}, which recovering run {store.run} there "
                        f"would disturb; recover without --same-vm to move it onto a free VM ({theirs} keeps running)")
    hosts = sorted((h for h in current.hosts(home) if h.name != host.name), key=lambda h: name_order(h.name))
    occ = occupancy.live_on(home, hosts, exclude=store.run)
    free = [h for h in occ.free(hosts) if ssh.reachable(home, h)]
    if not free:
        busy = occ.describe([h.name for h in hosts])
        # No capacity for now (`glue watch` waits and asks again, spending no budget): the neighbour ends, or
        # another VM frees up.
        raise NoCapacity(f"run {store.run}'s VM {host.name} also runs live {theirs}: replacing it would kill "
                         f"{'it' if len(others) == 1 else 'them'}, and there is no capacity elsewhere, no other VM "
                         f"is free{f' (live runs use {busy})' if busy else ''}; `glue up --vms {len(hosts) + 2}` adds "
                         f"one (then recover again), or recover once {others[0]} has ended (`glue stop --run "
                         f"{others[0]}`)")
    if keep_failed:
        console.print(f"--keep-failed: {host.name} is not kept apart (live {theirs} on it); the failed attempt is "
                      "stopped there")
    console.print(f"provision: {host.name} also runs live {theirs}, so it is not replaced; run {store.run} moves to "
                  f"{free[0].name}, a VM no live run uses")
    return free[0]

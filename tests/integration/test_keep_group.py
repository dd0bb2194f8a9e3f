"""--keep-failed for a multi-node group, on real VMs with real terraform: every live VM of the failed
attempt is kept (its processes frozen, the VM released from Terraform's state, new VMs under the same
names), `glue status` lists them, `glue ssh <id>` reaches them, `glue up` spares them and `glue down`
removes them. The recovery phases are called as `glue recover` calls them."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from glue.cloud.local.backend import LocalBackend
from glue.cluster import current
from glue.operations import lifecycle
from glue.operations.recovery import phases
from glue.runs.classify import AttemptClass
from glue.runs.records import AttemptRecord
from glue.runs.store import RunStore
from glue.train.state_paths import StatePaths

from .conftest import Kit

pytestmark = pytest.mark.integration
RUN, N = "g", 3


def _failure(outcome: AttemptClass, nodes: list[dict[str, object]]) -> phases.Failure:
    attempt = AttemptRecord.from_dict({"run": RUN, "attempt": N, "nodes": nodes, "vm": nodes[0]["vm"],
                                       "vm_id": nodes[0]["vm_id"]})
    return phases.Failure(outcome, N, attempt, {}, None, "2026-01-01T00:00:00.000000Z")


def _state(kit: Kit, vm: str, pid: int) -> str:
    return kit.glue("ssh", vm, "--", "ps", "-o", "stat=", "-p", str(pid), check=False).stdout.strip()


# `stress` (make test-all): make test keeps a failed run's VM (recovery.keep_failed), reachable by its id and
# listed by `glue status` (tests/e2e/test_watch.py::test_watch_recovers_unattended_within_budgets), and the
# test below; this one keeps every VM of a failed group, frozen.
@pytest.mark.stress
def test_every_live_vm_of_a_failed_group_is_kept_frozen_and_removed_only_by_down(kit: Kit) -> None:
    kit.glue("up", "--vms", "2", "--no-configure")
    old = current.hosts(kit.home)
    nodes: list[dict[str, object]] = [{"node": k, "vm": h.name, "vm_id": h.id} for k, h in enumerate(old)]
    # What is left of the failed attempt on each VM: a supervisor and a trainer, their pids where deploy keeps them.
    pids: dict[str, list[int]] = {}
    for h in old:
        start = (f"mkdir -p {StatePaths.of(RUN, N).folder} && "
                 "for i in 1 2; do nohup sleep 600 >/dev/null 2>&1 </dev/null & echo $!; done")
        pids[h.name] = [int(p) for p in kit.glue("ssh", h.name, "--", "sh", "-c", start).stdout.split()]
        record = json.dumps({"supervisor_pid": pids[h.name][0], "trainer_pid": pids[h.name][1]})
        kit.glue("ssh", h.name, "--", "sh", "-c",
                 f"echo '{record}' > {StatePaths.of(RUN, N).pids}")

    assert phases.keepable(kit.home, _failure(AttemptClass.COMM, nodes), keep_failed=False) == []
    keep = phases.keepable(kit.home, _failure(AttemptClass.COMM, nodes), keep_failed=True)
    assert [(k.name, k.id, k.run, k.attempt, k.failure_class) for k in keep] == [
        (h.name, h.id, RUN, N, "comm") for h in old]

    # Frozen (SIGSTOP), not killed, on every kept node.
    store = RunStore(current.bucket_info(kit.home), LocalBackend(kit.home).bucket_credentials(), RUN)
    phases.kill_attempt(kit.home, store, _failure(AttemptClass.COMM, nodes).attempt, freeze=keep)
    assert all(_state(kit, h.name, pid).startswith("T") for h in old for pid in pids[h.name])

    # Both leave Terraform's state alive; the apply makes new VMs under the same names.
    typed = _failure(AttemptClass.COMM, nodes).attempt.nodes  # as recovery reads them from the attempt record
    hosts, replaced = phases.provision(kit.home, Console(file=io.StringIO()), typed, same_vm=False, keep=keep)
    assert replaced == [h.name for h in old] and all(new.id != was.id for new, was in zip(hosts, old, strict=True))
    backend = LocalBackend(kit.home)
    assert all(backend.read_vm(h.id) is not None for h in old)
    assert [k.id for k in lifecycle.kept(kit.home)] == [h.id for h in old]
    # Still frozen, reached by their ids; `glue status` lists them.
    assert all(_state(kit, h.id, pid).startswith("T") for h in old for pid in pids[h.name])
    said = " ".join(kit.glue("status").stdout.split())
    assert all(f"kept for debugging: VM {h.id} (was {h.name})" in said for h in old), said

    # `glue up` spares them; `glue down` removes them with the cluster.
    kit.glue("up", "--no-configure")
    assert all(backend.read_vm(h.id) is not None for h in old)
    kit.glue("down")
    assert backend.owned_vm_ids() == [] and lifecycle.kept(kit.home) == []


def test_a_group_node_already_gone_is_not_kept_and_a_lost_vm_keeps_nothing(kit: Kit) -> None:
    kit.glue("up", "--vms", "2", "--no-configure")
    old = current.hosts(kit.home)
    nodes: list[dict[str, object]] = [{"node": k, "vm": h.name, "vm_id": h.id} for k, h in enumerate(old)]
    LocalBackend(kit.home).delete_vm(old[1].id)
    assert [k.id for k in phases.keepable(kit.home, _failure(AttemptClass.STALL, nodes), True)] == [old[0].id]
    assert phases.keepable(kit.home, _failure(AttemptClass.VM_LOST, nodes), True) == []  # its VMs are the fault

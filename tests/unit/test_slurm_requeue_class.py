"""How a Slurm restart's earlier attempt ended, read from its nodes' exit records, and the ranks its resume
check compares: a multi-node job's lost node is a lost VM whichever node it was."""

from __future__ import annotations

from typing import Any

from glue.runs.records import Manifest
from glue.scheduler.slurm.requeue import _why_ended, _world_size
from glue.train.run.notice import PREEMPTED_EXIT


class Exits:
    """The one store read _why_ended makes: each node's exit record of an attempt (None: none was written)."""

    def __init__(self, *codes: int | None) -> None:
        self.codes = codes

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        code = self.codes[node]
        return None if code is None else {"exit_code": code}


def test_a_node_without_an_exit_record_is_a_lost_vm_whichever_node_it_was() -> None:
    assert _why_ended(Exits(None), 1, 1) == ("vm_lost", "its node was lost; Slurm requeued the job")
    cls, why = _why_ended(Exits(143, None), 1, 2)
    assert cls == "vm_lost" and "node 1 of its 2 was lost" in why
    cls, why = _why_ended(Exits(None, 143), 1, 2)
    assert cls == "vm_lost" and "node 0 of its 2" in why


def test_nodes_that_saved_on_the_notice_are_preempted_and_other_exits_killed() -> None:
    assert _why_ended(Exits(PREEMPTED_EXIT, PREEMPTED_EXIT), 1, 2)[0] == "preempted"
    assert _why_ended(Exits(PREEMPTED_EXIT, 143), 1, 2)[0] == "preempted"
    cls, why = _why_ended(Exits(1), 1, 1)
    assert cls == "killed" and "exit 1" in why
    assert _why_ended(Exits(None), 1, 1, resubmitted=True)[0] == "vm_lost"


def test_the_world_size_is_one_on_a_single_node_and_nodes_times_gpus_under_torchrun() -> None:
    manifest = Manifest.from_dict({"run": "r", "config": {"resources": {"nodes": 2, "gpus_per_node": 3}}})
    assert _world_size(manifest, 2) == 6 and _world_size(manifest, 1) == 1
    assert _world_size(Manifest.from_dict({"run": "r", "config": {}}), 2) == 2

"""Which ended runs hold `glue down` up for their missing outputs: only a failure a recovery repairs on its
own. A run the user stopped, or one whose recovery needs --force (their own error, a repeatable OOM, a wrong
resume), never produces them by waiting, and must not make the cluster impossible to take down."""
from __future__ import annotations

import pytest

from glue.operations.down_guard import _awaits_recovery
from glue.runs.class_policy import STOPPED_ON_REQUEST
from glue.runs.classify import AttemptClass as C


@pytest.mark.parametrize("outcome", [C.VM_LOST, C.STALL, C.PREEMPTED, C.KILLED, C.STORAGE_LOST, C.COMM])
def test_a_failure_a_recovery_repairs_holds_the_cluster(outcome: C) -> None:
    assert _awaits_recovery(outcome, "whatever the monitor said")


@pytest.mark.parametrize("outcome", [C.USER_ERROR, C.OOM_GPU, C.OOM_HOST, C.BAD_RESTART, C.EXPORT_MISSING,
                                     C.RUNNING, C.COMPLETED])
def test_nothing_comes_of_waiting_for_these(outcome: C) -> None:
    assert not _awaits_recovery(outcome, None)


def test_a_run_stopped_on_request_does_not_hold_the_cluster() -> None:
    assert not _awaits_recovery(C.KILLED, STOPPED_ON_REQUEST)

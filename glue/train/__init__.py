"""Runs on the VM: checkpoints, state, heartbeat. Imports nothing from glue.infra / glue.cloud.

The names below load on first use: the controller's CLI imports light modules of this package
(glue.train.layout, glue.train.supervise) and must not pay for importing torch on every command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glue.train.checkpoint import Checkpointer, RestoreReport, Stateful
    from glue.train.ckpt_format import CheckpointStatus, Commit, ObjectRef, Problem, check_checkpoints
    from glue.train.errors import (
        CheckpointError,
        CorruptCheckpointError,
        NoValidCheckpointError,
        ObjectMissingError,
        SaveFailedError,
        StateMismatchError,
        StorageError,
        TargetError,
    )
    from glue.train.evaluation import EvalSetError, load_eval_set, record_evaluation
    from glue.train.fence import FencedError
    from glue.train.loader import LoaderRNG, ResumableLoader, WorkerRNG
    from glue.train.retry import RetryPolicy
    from glue.train.sampler import ResumableSampler
    from glue.train.state import RNGState, TrainState
    from glue.train.storage import Storage, open_target

_WHERE = {
    "checkpoint": ("Checkpointer", "RestoreReport", "Stateful"),
    "errors": ("CheckpointError", "CorruptCheckpointError", "NoValidCheckpointError", "ObjectMissingError",
               "SaveFailedError", "StateMismatchError", "StorageError", "TargetError"),
    "evaluation": ("EvalSetError", "load_eval_set", "record_evaluation"),
    "fence": ("FencedError",),
    "ckpt_format": ("CheckpointStatus", "Commit", "ObjectRef", "Problem", "check_checkpoints"),
    "loader": ("LoaderRNG", "ResumableLoader", "WorkerRNG"),
    "sampler": ("ResumableSampler",),
    "state": ("RNGState", "TrainState"),
    "retry": ("RetryPolicy",),
    "storage": ("Storage", "open_target"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'glue.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"glue.train.{module}"), name)


def validate_checkpoints(target: str, *, deep: bool = True, **target_args: object) -> list[CheckpointStatus]:
    """List and validate every checkpoint under a target (`glue recover` uses this), newest first."""
    from glue.train.ckpt_format import check_checkpoints
    from glue.train.storage import open_target

    return check_checkpoints(open_target(target, **target_args), deep=deep)  # type: ignore[arg-type]


__all__ = [
    "CheckpointError",
    "CheckpointStatus",
    "Checkpointer",
    "Commit",
    "CorruptCheckpointError",
    "EvalSetError",
    "FencedError",
    "LoaderRNG",
    "NoValidCheckpointError",
    "ObjectMissingError",
    "ObjectRef",
    "Problem",
    "RNGState",
    "RestoreReport",
    "ResumableLoader",
    "ResumableSampler",
    "RetryPolicy",
    "SaveFailedError",
    "StateMismatchError",
    "Stateful",
    "Storage",
    "StorageError",
    "TargetError",
    "TrainState",
    "WorkerRNG",
    "check_checkpoints",
    "load_eval_set",
    "open_target",
    "record_evaluation",
    "validate_checkpoints",
]

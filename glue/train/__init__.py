"""Runs on the VM: checkpoints, state, heartbeat. Imports nothing from glue.infra / glue.cloud.

The names below load on first use: the controller's CLI imports light modules of this package
(glue.train.layout, glue.train.run.supervise) and must not pay for importing torch on every command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glue.train.checkpoint.checkpointer import Checkpointer
    from glue.train.checkpoint.components import RestoreReport, Stateful
    from glue.train.checkpoint.fence import FencedError
    from glue.train.checkpoint.format import (
        CheckpointStatus,
        Commit,
        ObjectRef,
        Problem,
        check_checkpoints,
        validate_checkpoints,
    )
    from glue.train.checkpoint.optimizer_state import OptimizerState
    from glue.train.data.loader import LoaderRNG, ResumableLoader, WorkerRNG
    from glue.train.data.sampler import ResumableSampler
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
    from glue.train.loop_state import RNGState, TrainState, seed_all
    from glue.train.run.agreement import agree
    from glue.train.run.context import RunContext
    from glue.train.run.evaluation import EvalSetError, load_eval_set, record_evaluation
    from glue.train.storage.retry import RetryPolicy
    from glue.train.storage.target import Storage, open_target

_WHERE = {
    "checkpoint.checkpointer": ("Checkpointer",),
    "checkpoint.components": ("RestoreReport", "Stateful"),
    "errors": ("CheckpointError", "CorruptCheckpointError", "NoValidCheckpointError", "ObjectMissingError",
               "SaveFailedError", "StateMismatchError", "StorageError", "TargetError"),
    "run.evaluation": ("EvalSetError", "load_eval_set", "record_evaluation"),
    "checkpoint.fence": ("FencedError",),
    "checkpoint.optimizer_state": ("OptimizerState",),
    "checkpoint.format": ("CheckpointStatus", "Commit", "ObjectRef", "Problem", "check_checkpoints",
                          "validate_checkpoints"),
    "data.loader": ("LoaderRNG", "ResumableLoader", "WorkerRNG"),
    "data.sampler": ("ResumableSampler",),
    "loop_state": ("RNGState", "TrainState", "seed_all"),
    "storage.retry": ("RetryPolicy",),
    "storage.target": ("Storage", "open_target"),
    "run.context": ("RunContext",),
    "run.agreement": ("agree",),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'glue.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"glue.train.{module}"), name)


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
    "OptimizerState",
    "Problem",
    "RNGState",
    "RestoreReport",
    "ResumableLoader",
    "ResumableSampler",
    "RetryPolicy",
    "RunContext",
    "SaveFailedError",
    "StateMismatchError",
    "Stateful",
    "Storage",
    "StorageError",
    "TargetError",
    "TrainState",
    "WorkerRNG",
    "agree",
    "check_checkpoints",
    "load_eval_set",
    "open_target",
    "record_evaluation",
    "seed_all",
    "validate_checkpoints",
]

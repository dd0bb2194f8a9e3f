"""Runs on the VM: checkpoints, state, heartbeat. Imports nothing from glue.infra / glue.cloud."""

from glue.train.checkpoint import Checkpointer, RestoreReport, Stateful
from glue.train.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ObjectMissingError,
    SaveFailedError,
    StateMismatchError,
    StorageError,
    TargetError,
)
from glue.train.manifest import CheckpointStatus, Commit, ObjectRef, Problem, check_checkpoints
from glue.train.sampler import ResumableSampler
from glue.train.state import RNGState, TrainState
from glue.train.storage import RetryPolicy, Storage, open_target


def validate_checkpoints(target: str, *, deep: bool = True, **target_args: object) -> list[CheckpointStatus]:
    """List and validate every checkpoint under a target (`glue recover` uses this), newest first."""
    return check_checkpoints(open_target(target, **target_args), deep=deep)  # type: ignore[arg-type]


__all__ = [
    "CheckpointError",
    "CheckpointStatus",
    "Checkpointer",
    "Commit",
    "CorruptCheckpointError",
    "ObjectMissingError",
    "ObjectRef",
    "Problem",
    "RNGState",
    "RestoreReport",
    "ResumableSampler",
    "RetryPolicy",
    "SaveFailedError",
    "StateMismatchError",
    "Stateful",
    "Storage",
    "StorageError",
    "TargetError",
    "TrainState",
    "check_checkpoints",
    "open_target",
    "validate_checkpoints",
]

"""Checkpoint errors: each carries a one-line message that says what is wrong and where.

`glue.train` runs on the VM with only torch/numpy/boto3, so these do not derive from
`glue.errors.GlueError`; the CLI treats any `CheckpointError` the same way (`exit_code`).
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: a checkpoint problem the user can act on."""

    exit_code = 1


class TargetError(CheckpointError):
    """The target cannot be used: bad URL, missing bucket, no or rejected credentials, unreachable."""


class StorageError(CheckpointError):
    """A storage operation failed after all retries (the target itself looked fine)."""


class ObjectMissingError(StorageError):
    """An object that should exist does not (a partial or pruned checkpoint)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key} does not exist")
        self.key = key


class SaveFailedError(CheckpointError):
    """A background save failed for good; raised by the next save() / flush() / close()."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(f"checkpoint of step {step} failed and was not committed: {_one_line(cause)}")
        self.step = step


class StateMismatchError(CheckpointError):
    """A checkpoint does not fit the live objects (different model shape, missing keys, ...)."""

    def __init__(self, component: str, key: str, what: str) -> None:
        super().__init__(f"checkpoint component {component!r}, key {key!r}: {what}")
        self.component = component
        self.key = key


class CorruptCheckpointError(CheckpointError):
    """An explicitly requested checkpoint is not valid (restore(step=N) on a corrupt step)."""


class NoValidCheckpointError(CorruptCheckpointError):
    """Committed checkpoints exist but none is valid: starting from step 0 would silently lose the run."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if not isinstance(exc, CheckpointError) else first

"""From a verified checkpoint's objects to component states: which object is this rank's, how it is
deserialized, and in which order states go into the live objects (the model last, so an error in
any other component leaves the model untouched)."""

from __future__ import annotations

import pickle
from typing import IO, Any, cast

import torch

from glue.train.buffers import BlobReader
from glue.train.ckpt_format import Commit, ObjectRef
from glue.train.errors import CheckpointError, StateMismatchError


def pick_object(commit: Commit, name: str, *, per_rank: bool, rank: int, world_size: int) -> ObjectRef:
    """The object holding component `name` for this rank; StateMismatchError if there is none."""
    refs = commit.components.get(name)
    if refs is None:
        have = ", ".join(sorted(commit.components))
        raise StateMismatchError(name, "", f"not in the checkpoint of step {commit.step} (it has: {have})")
    want_rank = rank if per_rank else None
    ref = next((r for r in refs if r.rank == want_rank), None)
    if ref is None:
        what = (
            f"no state for rank {rank}: saved with world_size {commit.world_size}, this run has {world_size}"
            if per_rank
            else "saved per rank in the checkpoint but registered as shared here"
        )
        raise StateMismatchError(name, f"rank{rank}" if per_rank else "", what)
    return ref


def deserialize(name: str, ref: ObjectRef, body: bytes | bytearray, *, weights_only: bool) -> Any:
    """torch.load an object already in memory (read in place, not copied first)."""
    try:
        return torch.load(cast(IO[bytes], BlobReader(body)), map_location="cpu", weights_only=weights_only)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        hint = "; if it holds custom Python objects, use weights_only=False" if weights_only else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint component {name!r}: cannot load {ref.key}: {first}{hint}") from exc


def load_priority(obj: object) -> int:
    """Sort key: components we cannot validate fully load first, the model last."""
    if isinstance(obj, torch.nn.Module):
        return 3
    if isinstance(obj, torch.optim.Optimizer):
        return 2
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return 1
    return 0

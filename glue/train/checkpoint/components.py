"""What a checkpoint is made of: named components (anything with state_dict()/load_state_dict()), and
what a restore reports."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

from glue.train.checkpoint.format import CheckpointStatus
from glue.train.errors import CheckpointError


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass
class Component:
    """A named piece of state saved as one file per checkpoint (per rank when per_rank)."""

    name: str
    obj: Stateful
    per_rank: bool
    sharded: bool | None = None  # holds DTensors (saved through DCP); known at the first save

    @classmethod
    def of(cls, name: str, obj: Any, per_rank: bool | None) -> Component:
        """A component from what `Checkpointer.register` was given; one CheckpointError line when unusable."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name) or name.startswith("rank"):
            raise CheckpointError(f"component name {name!r} must be [A-Za-z0-9_-]+ and not start with 'rank'")
        if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
            raise CheckpointError(f"component {name!r} has no state_dict()/load_state_dict()")
        if per_rank is None:
            per_rank = bool(getattr(obj, "checkpoint_per_rank", False)) or _is_stateful_dataloader(obj)
        return cls(name, obj, per_rank)


@dataclass
class RestoreReport:
    step: int
    skipped: list[CheckpointStatus] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)


def _is_stateful_dataloader(obj: object) -> bool:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return False
    return isinstance(obj, StatefulDataLoader)


def is_sharded(state: Any) -> bool:
    """True when a state_dict holds a DTensor (FSDP2, tensor parallel) anywhere, nested included."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:
        return False  # never imported: no DTensor exists (and importing it costs most of a second)
    return _holds(state, dtensor.DTensor)


def _holds(state: Any, cls: type) -> bool:
    if isinstance(state, cls):
        return True
    if isinstance(state, dict):
        return any(_holds(v, cls) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_holds(v, cls) for v in state)
    return False

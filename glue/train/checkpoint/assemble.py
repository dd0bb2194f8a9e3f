"""From a checkpoint's verified objects to each registered component's state on this rank.

Three cases: one object (shared state, or this rank's own at the same world size); a sharded
component (every saving rank's chunks and DCP metadata, resharded onto this rank's layout); a per-rank
component at another world size, which only a component that says how allows:
`checkpoint_reshard(states_of_every_saved_rank, rank, world_size) -> this rank's state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from glue.train.checkpoint.components import Component
from glue.train.checkpoint.format import Commit, ObjectRef, object_key
from glue.train.checkpoint.load import pick_object
from glue.train.errors import CheckpointError, StateMismatchError


def reshards(c: Component, commit: Commit, world_size: int) -> bool:
    """A per-rank component that needs every saved rank's state: the world size changed and it can reshard."""
    return c.per_rank and commit.world_size != world_size and callable(getattr(c.obj, "checkpoint_reshard", None))


def wanted(components: Mapping[str, Component], commit: Commit, rank: int, world_size: int) -> dict[str, str]:
    """object key -> component name, for the objects this rank deserializes from `commit`."""
    out: dict[str, str] = {}
    for c in components.values():
        if c.name in commit.sharded or reshards(c, commit, world_size):
            out.update({ref.key: c.name for ref in commit.components.get(c.name, [])})
        else:
            out[object_key(c.name, rank if c.per_rank else None)] = c.name
    return out


def states(
    components: Mapping[str, Component], commit: Commit, loaded: dict[str, Future[Any]], rank: int, world_size: int
) -> dict[str, Any]:
    """Each component's state (waits for the loads still running; raises the first load's error)."""
    out: dict[str, Any] = {}
    for c in components.values():
        refs = commit.components.get(c.name)
        if c.name in commit.sharded and refs is not None:
            out[c.name] = _sharded(c, commit, refs, loaded, rank)
        elif refs is not None and reshards(c, commit, world_size):
            by_rank = sorted((r for r in refs if r.rank is not None), key=lambda r: r.rank or 0)
            if [r.rank for r in by_rank] != list(range(commit.world_size)):
                raise StateMismatchError(c.name, "", f"the checkpoint lacks some rank's state of {commit.world_size}")
            reshard = c.obj.checkpoint_reshard  # type: ignore[attr-defined]  # checked by reshards()
            out[c.name] = reshard([_take(commit, r, loaded, c.name) for r in by_rank], rank, world_size)
        else:
            ref = pick_object(commit, c.name, per_rank=c.per_rank, rank=rank, world_size=world_size)
            out[c.name] = _take(commit, ref, loaded, c.name)
    return out


def _sharded(c: Component, commit: Commit, refs: list[ObjectRef], loaded: dict[str, Future[Any]], rank: int) -> Any:
    from glue.train.checkpoint import sharded_load

    parts = {r.rank: _take(commit, r, loaded, c.name) for r in refs if r.rank is not None}
    return sharded_load.load(c.name, c.obj.state_dict(), parts, rank)


def _take(commit: Commit, ref: ObjectRef, loaded: dict[str, Future[Any]], name: str) -> Any:
    loading = loaded.pop(ref.key, None)
    if loading is None:
        raise CheckpointError(f"checkpoint step {commit.step}: {ref.key} for {name!r} was not read")
    return loading.result()

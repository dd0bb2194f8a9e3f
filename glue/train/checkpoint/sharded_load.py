"""Restoring sharded state through torch.distributed.checkpoint, at any world size.

The checkpoint holds DCP's metadata (global shape and chunks of every tensor) and each saving rank's
chunks. DCP's load planner maps the chunks onto whatever this rank holds now (a DTensor on a mesh of
another size, or a plain full tensor): that is the resharding restore. Loading goes into a template
built like the live state, never into the live tensors, so a failure leaves the component untouched.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from glue.train.checkpoint.sharded_save import rank_of_entry
from glue.train.errors import CheckpointError, StateMismatchError


def decode(raw: Mapping[str, Any]) -> md.Metadata:
    """DCP metadata from the plain form glue.train.checkpoint.sharded_save.encode writes."""
    state: dict[str, Any] = {}
    for fqn, meta in raw["tensors"].items():
        if meta is None:
            state[fqn] = md.BytesStorageMetadata()
            continue
        chunks = [md.ChunkStorageMetadata(torch.Size(off), torch.Size(size)) for off, size in meta["chunks"]]
        props = md.TensorProperties(dtype=getattr(torch, str(meta["dtype"])))
        state[fqn] = md.TensorStorageMetadata(props, torch.Size(meta["size"]), chunks)
    where = {md.MetadataIndex(fqn, None if off is None else torch.Size(off)): key for fqn, off, key in raw["where"]}
    return md.Metadata(state, planner_data={fqn: tuple(path) for fqn, path in raw["paths"].items()},
                       storage_data=where)


class _ChunkReader(StorageReader):
    """A DCP storage reader over chunks already downloaded and verified (by rank that wrote them)."""

    def __init__(self, name: str, metadata: md.Metadata, chunks: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        super().__init__()
        self.name = name
        self.metadata = metadata
        self.chunks = chunks

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> md.Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: md.Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        where = self.metadata.storage_data
        for req in plan.items:
            key = where[req.storage_index]
            saved = self.chunks.get(rank_of_entry(key), {}).get(key)
            if saved is None:
                raise CheckpointError(f"sharded component {self.name!r}: chunk {key} of "
                                      f"{req.storage_index.fqn} is not in the checkpoint")
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(saved.numpy().tobytes()))
                continue
            src = narrow_tensor_by_index(saved, req.storage_offsets, req.lengths)
            dst = planner.resolve_tensor(req).detach()
            if dst.size() != src.size():
                raise StateMismatchError(self.name, req.storage_index.fqn,
                                         f"chunk {tuple(src.size())} does not fit {tuple(dst.size())}")
            dst.copy_(src)
            planner.commit_tensor(req, dst)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


def template_of(state: Any) -> Any:
    """A state shaped like `state` (same DTensor placements) that shares no storage with it."""
    if isinstance(state, torch.Tensor):
        return torch.empty_like(state.detach())
    if isinstance(state, dict):
        return type(state)((k, template_of(v)) for k, v in state.items())  # OrderedDict stays one
    if isinstance(state, list):
        return [template_of(v) for v in state]
    return state


def _tensors(state: Any, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors of a nested state by DCP's flattened key (path parts joined by '.')."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    out: dict[str, torch.Tensor] = {}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else ()
    for k, v in items:
        out.update(_tensors(v, f"{prefix}.{k}"))
    return out


def check_fits(name: str, live: Any, metadata: md.Metadata) -> None:
    """StateMismatchError naming the first tensor the checkpoint lacks or holds in another shape."""
    saved = metadata.state_dict_metadata
    live_tensors = _tensors(live, name)
    for key in saved:
        if key.startswith(name + ".") and key not in live_tensors and isinstance(saved[key], md.TensorStorageMetadata):
            raise StateMismatchError(name, key.removeprefix(name + "."), "in the checkpoint but not here "
                                                                          "(a different model?)")
    for key, tensor in live_tensors.items():
        have = saved.get(key)
        if have is None:
            raise StateMismatchError(name, key.removeprefix(name + "."), "missing from the checkpoint")
        if isinstance(have, md.TensorStorageMetadata) and tuple(have.size) != tuple(tensor.shape):
            raise StateMismatchError(name, key.removeprefix(name + "."),
                                     f"checkpoint has shape {tuple(have.size)}, this model {tuple(tensor.shape)}")


def merged(name: str, parts: Mapping[int, md.Metadata]) -> md.Metadata:
    """One metadata for the whole checkpoint from each saving rank's own: every tensor's chunks from all
    ranks (a replicated tensor, saved by each, once: the lowest rank's), where each chunk lives."""
    tensors: dict[str, Any] = {}
    where: dict[md.MetadataIndex, Any] = {}
    planner: dict[str, Any] = {}
    for rank in sorted(parts):
        part = parts[rank]
        for fqn, meta in part.state_dict_metadata.items():
            have = tensors.get(fqn)
            if have is None:
                tensors[fqn] = (md.TensorStorageMetadata(meta.properties, meta.size, list(meta.chunks))
                                if isinstance(meta, md.TensorStorageMetadata) else meta)
            elif isinstance(meta, md.TensorStorageMetadata) and isinstance(have, md.TensorStorageMetadata):
                if tuple(have.size) != tuple(meta.size):
                    raise CheckpointError(f"sharded component {name!r}: ranks saved {fqn} with different shapes "
                                          f"({tuple(have.size)}, {tuple(meta.size)}): not one checkpoint")
                known = {tuple(c.offsets) for c in have.chunks}
                have.chunks.extend(c for c in meta.chunks if tuple(c.offsets) not in known)
        for index, key in (part.storage_data or {}).items():
            where.setdefault(index, key)
        for fqn, path in (part.planner_data or {}).items():
            planner.setdefault(fqn, path)
    return md.Metadata(tensors, planner_data=planner, storage_data=where)


def load(name: str, live: Any, parts: Mapping[int, Mapping[str, Any]]) -> Any:
    """The saved state (each saving rank's {"metadata", "chunks"}) resharded onto `live`'s layout. No
    collective: every rank holds every rank's chunks, so each loads its own shards by itself."""
    metadata = merged(name, {rank: decode(part["metadata"]) for rank, part in parts.items()})
    chunks = {rank: part["chunks"] for rank, part in parts.items()}
    check_fits(name, live, metadata)
    state = {name: template_of(live)}
    try:
        dcp.load(state, storage_reader=_ChunkReader(name, metadata, chunks), no_dist=True)
    except CheckpointException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"sharded component {name!r}: {first}") from exc
    return state[name]


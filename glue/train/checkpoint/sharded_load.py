"""Restoring sharded state through torch.distributed.checkpoint, at any world size.

The checkpoint holds DCP's metadata (global shape and chunks of every tensor) and each saving rank's
chunks. DCP's load planner maps the chunks onto whatever this rank holds now (a DTensor on a mesh of
another size, or a plain full tensor): that is the resharding restore. Loading goes into a template
built like the live state, never into the live tensors, so a failure leaves the component untouched.

When every tensor this rank holds was saved as exactly one chunk (a restore at the world size and
placements it was saved with), DCP is not needed: the state is made of the downloaded chunks
themselves (views of the verified objects, no template and no copy), which load_state_dict then
copies into the live tensors once.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.tensor import DTensor
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


def template_of(state: Any, *, empty: bool = True) -> Any:
    """A state shaped like `state` (same DTensor placements) that shares no storage with it (empty=False:
    its tensors are None, for the caller to set)."""
    if isinstance(state, torch.Tensor):
        return torch.empty_like(state.detach()) if empty else None
    if isinstance(state, dict):
        return type(state)((k, template_of(v, empty=empty)) for k, v in state.items())  # OrderedDict stays one
    if isinstance(state, list):
        return [template_of(v, empty=empty) for v in state]
    return state


def _str_keys(state: Any) -> bool:
    if isinstance(state, dict):
        return all(isinstance(k, str) and _str_keys(v) for k, v in state.items())
    return all(_str_keys(v) for v in state) if isinstance(state, list) else True


def _direct(name: str, live: Any, metadata: md.Metadata, chunks: Mapping[int, Mapping[str, torch.Tensor]],
            rank: int) -> Any:
    """The saved state in `live`'s layout made of the saved chunks, when each tensor here is exactly one
    saved chunk; None otherwise (DCP maps it). A chunk of this rank's own object is used as is (a view
    of it); one from another rank's (a replicated tensor: saved once) is copied, not to keep that
    whole object alive."""
    if not _str_keys(live):
        return None  # DCP's flattened paths name keys as strings: no way back to other keys
    flat, paths = flatten_state_dict({name: live})
    saved = metadata.state_dict_metadata
    out = {name: template_of(live, empty=False)}
    for fqn, value in flat.items():
        meta = saved.get(fqn)
        if isinstance(meta, md.BytesStorageMetadata):
            raw = _saved_chunk(metadata, chunks, md.MetadataIndex(fqn))
            if raw is None:
                return None
            set_element(out, paths[fqn], torch.load(io.BytesIO(raw[1].numpy().tobytes()), weights_only=False))
            continue  # as DCP's planner loads a non-tensor value
        if not isinstance(meta, md.TensorStorageMetadata) or not isinstance(value, torch.Tensor):
            return None
        if isinstance(value, DTensor):
            if value.device_mesh.get_coordinate() is None:
                return None
            mine = value.__create_chunk_list__()
            if len(mine) != 1:
                return None
            offsets, sizes = mine[0].offsets, mine[0].sizes
        elif type(value) is torch.Tensor:
            offsets, sizes = torch.Size([0] * value.dim()), value.shape
        else:
            return None
        found = _saved_chunk(metadata, chunks, md.MetadataIndex(fqn, torch.Size(offsets)))
        if found is None or tuple(found[1].shape) != tuple(sizes) or found[1].dtype != value.dtype:
            return None
        chunk = found[1] if found[0] == rank else found[1].clone()
        if isinstance(value, DTensor):
            chunk = DTensor.from_local(chunk, value.device_mesh, value.placements, run_check=False,
                                       shape=value.shape, stride=value.stride())
        set_element(out, paths[fqn], chunk)
    return out[name]


def _saved_chunk(metadata: md.Metadata, chunks: Mapping[int, Mapping[str, torch.Tensor]],
                 index: md.MetadataIndex) -> tuple[int, torch.Tensor] | None:
    """The saving rank and the saved chunk at `index`, if the checkpoint has one there."""
    key = metadata.storage_data.get(index)
    if key is None:
        return None
    chunk = chunks.get(rank_of_entry(key), {}).get(key)
    return None if chunk is None else (rank_of_entry(key), chunk)


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


def load(name: str, live: Any, parts: Mapping[int, Mapping[str, Any]], rank: int = 0) -> Any:
    """The saved state (each saving rank's {"metadata", "chunks"}) resharded onto `live`'s layout (this
    process is rank `rank`). No collective: every rank holds every rank's chunks, so each loads its own
    shards by itself."""
    metadata = merged(name, {r: decode(part["metadata"]) for r, part in parts.items()})
    chunks = {r: part["chunks"] for r, part in parts.items()}
    check_fits(name, live, metadata)
    direct = _direct(name, live, metadata, chunks, rank)
    if direct is not None:
        return direct
    state = {name: template_of(live)}
    try:
        dcp.load(state, storage_reader=_ChunkReader(name, metadata, chunks), no_dist=True)
    except CheckpointException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"sharded component {name!r}: {first}") from exc
    return state[name]


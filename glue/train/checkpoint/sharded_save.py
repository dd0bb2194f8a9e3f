"""The training-thread half of saving sharded state (DTensors: FSDP2, tensor parallel) through
torch.distributed.checkpoint.

Each rank lets DCP plan its own part (`no_dist`: no collective on the training thread, which then
waits only for the host copy): the chunks of its shards, with their global shapes and offsets, in DCP
metadata of its own. The storage writer here copies each chunk to a reused host buffer and names where
it lives. The bytes go through the ordinary background commit: every rank uploads one object
(`<name>.rank<r>.pt`: its metadata and chunks), rank 0 commits for all once every rank's objects are
verified. Restore merges the ranks' metadata (glue.train.checkpoint.sharded_load). Nothing is written
by DCP itself, so nothing is renamed.

DCP's planning costs the training thread about a third of the copy itself (a few hundred objects
built per save), and its result depends only on the state's layout. So each component's plan (which
chunk goes to which entry, and the metadata) is kept while the flattened state's keys, shapes, dtypes
and placements stay the same; a save then only copies the chunks.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

from glue.train.checkpoint.snapshot import HostSnapshotter


def entry_key(rank: int, index: int) -> str:
    """Where one chunk lives: entry `index` of rank `rank`'s object (DCP's storage_data)."""
    return f"{rank}/{index}"


def rank_of_entry(key: str) -> int:
    return int(key.split("/", 1)[0])


@dataclass
class Staged:
    """One rank's part of a sharded component: its chunks by entry key, and the DCP metadata of them."""

    chunks: dict[str, torch.Tensor]
    metadata: Metadata
    encoded: dict[str, Any] | None = None  # encode(metadata), when already known

    def as_state(self) -> dict[str, Any]:
        """What is saved as this rank's object: plain values only (weights_only loading, any Python)."""
        return {"metadata": self.encoded if self.encoded is not None else encode(self.metadata),
                "chunks": self.chunks}


def encode(metadata: Metadata) -> dict[str, Any]:
    """DCP metadata as plain lists, strings and numbers. Pickled as is it would carry DCP's classes, whose
    pickled form depends on the Python version (3.12 pickles an enum through getattr, which torch's
    weights_only loader refuses)."""
    tensors: dict[str, Any] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            tensors[fqn] = {"dtype": str(meta.properties.dtype).removeprefix("torch."), "size": list(meta.size),
                            "chunks": [[list(c.offsets), list(c.sizes)] for c in meta.chunks]}
        else:
            tensors[fqn] = None  # a non-tensor value, saved as bytes
    where = [[i.fqn, None if i.offset is None else list(i.offset), key] for i, key in metadata.storage_data.items()]
    paths = {fqn: list(path) for fqn, path in (metadata.planner_data or {}).items()}
    return {"tensors": tensors, "where": where, "paths": paths}


class _HostWriter(StorageWriter):
    """A DCP storage writer that writes nothing: it copies each chunk to (reused) host buffers."""

    def __init__(self, name: str, rank: int, snap: HostSnapshotter) -> None:
        super().__init__()
        self.name = name
        self.rank = rank
        self.snap = snap
        self.chunks: dict[str, torch.Tensor] = {}
        self.items: list[tuple[str, bool, Any]] = []  # entry i: (flattened key, saved as bytes, offset)
        self.metadata: Metadata | None = None

    def reset(self, checkpoint_id: Any = None) -> None:
        self.chunks = {}
        self.items = []
        self.metadata = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results = []
        for i, item in enumerate(plan.items):
            key = entry_key(self.rank, i)
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                chunk = torch.frombuffer(bytearray(data.getbuffer()), dtype=torch.uint8)
            else:
                assert isinstance(data, torch.Tensor)
                chunk = self.snap.copy_tensor(_chunk_path(self.name, item.index.fqn, item.index.offset),
                                              data.contiguous())
            self.chunks[key] = chunk
            results.append(WriteResult(index=item.index, size_in_bytes=chunk.nbytes, storage_data=key))
            self.items.append((item.index.fqn, item.type == WriteItemType.BYTE_IO, item.index.offset))
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        self.metadata = metadata

    def storage_meta(self) -> StorageMeta | None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


def _chunk_path(name: str, fqn: str, offset: Any) -> str:
    """The host buffer of one chunk (the same whether DCP planned the save or a kept plan did)."""
    return f"{name}/{fqn}/{tuple(offset or ())}"


def _layout(flat: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What DCP's plan of a flattened state depends on on this rank: its keys, each tensor's global shape,
    dtype and placement (which fix this rank's shard); other values are saved as bytes whatever they
    hold. None for anything else (a ShardedTensor, a tensor subclass): always planned by DCP."""
    out: list[Any] = []
    for fqn, v in flat.items():
        if isinstance(v, DTensor):
            out.append((fqn, tuple(v.shape), v.dtype, v.placements, v.device_mesh))
        elif type(v) is torch.Tensor or type(v) is torch.nn.Parameter:
            out.append((fqn, tuple(v.shape), v.dtype))
        elif isinstance(v, torch.Tensor):
            return None
        else:
            out.append((fqn,))
    return tuple(out)


@dataclass
class _Plan:
    layout: tuple[Any, ...]
    items: list[tuple[str, bool, Any]]  # entry i: (flattened key, saved as bytes, offset)
    metadata: Metadata
    encoded: dict[str, Any]
    saved: dict[int, tuple[bytes, torch.Tensor]] = field(default_factory=dict)  # entry -> (pickled, saved)

    def as_bytes(self, entry: int, value: Any) -> torch.Tensor:
        """A non-tensor value as DCP's planner writes it (torch.save); an unchanged one (the same pickle:
        a learning rate, the betas) reuses its last bytes, as torch.save costs a hundred times more."""
        try:
            pickled: bytes | None = pickle.dumps(value)
        except (pickle.PicklingError, TypeError, AttributeError):
            pickled = None  # only torch.save's pickler takes it: saved anew every time
        last = self.saved.get(entry)
        if last is not None and pickled is not None and last[0] == pickled:
            return last[1]
        buf = io.BytesIO()
        torch.save(value, buf)
        out = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
        if pickled is not None:
            self.saved[entry] = (pickled, out)
        return out


class Plans:
    """Each sharded component's last DCP plan on this rank, reused while its layout is unchanged."""

    def __init__(self) -> None:
        self._plans: dict[str, _Plan] = {}

    def stage(self, name: str, state: Any, rank: int, snap: HostSnapshotter) -> Staged:
        flat, _ = flatten_state_dict({name: state})
        layout = _layout(flat)
        plan = self._plans.get(name)
        if plan is None or layout is None or plan.layout != layout:
            writer = _HostWriter(name, rank, snap)
            dcp.save({name: state}, storage_writer=writer, no_dist=True)
            snap.wait()
            assert writer.metadata is not None  # finish() runs on every rank under no_dist
            staged = Staged(writer.chunks, writer.metadata, encode(writer.metadata))
            if layout is not None and len({item[0] for item in writer.items}) == len(writer.items):
                self._plans[name] = _Plan(layout, writer.items, writer.metadata, staged.as_state()["metadata"])
            else:
                self._plans.pop(name, None)  # a key in several entries: not a layout this cache reproduces
            return staged
        chunks: dict[str, torch.Tensor] = {}
        for i, (fqn, as_bytes, offset) in enumerate(plan.items):
            value = flat[fqn]
            if as_bytes:
                chunks[entry_key(rank, i)] = plan.as_bytes(i, value)
                continue
            local = value.to_local() if isinstance(value, DTensor) else value
            chunks[entry_key(rank, i)] = snap.copy_tensor(_chunk_path(name, fqn, offset), local.contiguous())
        snap.wait()
        return Staged(chunks, plan.metadata, plan.encoded)


def stage(name: str, state: Any, rank: int, snap: HostSnapshotter) -> Staged:
    """Plan this rank's part of a sharded state's save (no collective) and copy its chunks to host."""
    return Plans().stage(name, state, rank, snap)

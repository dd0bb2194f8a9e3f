"""The training-thread half of saving sharded state (DTensors: FSDP2, tensor parallel) through
torch.distributed.checkpoint.

Each rank lets DCP plan its own part (`no_dist`: no collective on the training thread, which then
waits only for the host copy): the chunks of its shards, with their global shapes and offsets, in DCP
metadata of its own. The storage writer here copies each chunk to a reused host buffer and names where
it lives. The bytes go through the ordinary background commit: every rank uploads one object
(`<name>.rank<r>.pt`: its metadata and chunks), rank 0 commits for all once every rank's objects are
verified. Restore merges the ranks' metadata (glue.train.checkpoint.sharded_load). Nothing is written
by DCP itself, so nothing is renamed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
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

    def as_state(self) -> dict[str, Any]:
        """What is saved as this rank's object: plain values only (weights_only loading, any Python)."""
        return {"metadata": encode(self.metadata), "chunks": self.chunks}


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
        self.metadata: Metadata | None = None

    def reset(self, checkpoint_id: Any = None) -> None:
        self.chunks = {}
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
                path = f"{self.name}/{item.index.fqn}/{tuple(item.index.offset or ())}"
                chunk = self.snap.copy_tensor(path, data.contiguous())
            self.chunks[key] = chunk
            results.append(WriteResult(index=item.index, size_in_bytes=chunk.nbytes, storage_data=key))
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


def stage(name: str, state: Any, rank: int, snap: HostSnapshotter) -> Staged:
    """Plan this rank's part of a sharded state's save (no collective) and copy its chunks to host."""
    writer = _HostWriter(name, rank, snap)
    dcp.save({name: state}, storage_writer=writer, no_dist=True)
    snap.wait()
    assert writer.metadata is not None  # finish() runs on every rank under no_dist
    return Staged(writer.chunks, writer.metadata)

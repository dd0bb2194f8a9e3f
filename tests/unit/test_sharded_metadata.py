"""A sharded checkpoint's DCP metadata is stored as plain values: it loads with weights_only=True whatever
Python pickled it, and decodes back to what DCP needs to map the chunks."""

from __future__ import annotations

import io
from typing import Any

import torch

from glue.train.checkpoint.sharded_load import decode, merged
from glue.train.checkpoint.sharded_save import stage
from glue.train.checkpoint.snapshot import HostSnapshotter


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float))


def test_the_metadata_is_plain_and_round_trips() -> None:
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16),
             "groups": [{"lr": 0.1}]}
    staged = stage("model", state, 0, HostSnapshotter())
    saved = staged.as_state()
    assert _plain(saved["metadata"])
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)  # no DCP class, no allow-list
    back = decode(loaded["metadata"])
    original = staged.metadata
    assert back.state_dict_metadata.keys() == original.state_dict_metadata.keys()
    for fqn, meta in original.state_dict_metadata.items():
        got = back.state_dict_metadata[fqn]
        assert type(got) is type(meta)
        if hasattr(meta, "size"):
            assert got.size == meta.size and got.properties.dtype == meta.properties.dtype  # type: ignore[union-attr]
            assert [(c.offsets, c.sizes) for c in got.chunks] == [(c.offsets, c.sizes) for c in meta.chunks]  # type: ignore[union-attr]
    assert back.storage_data == original.storage_data
    assert back.planner_data == original.planner_data
    # Two ranks' parts with a replicated tensor each: merged once, from the lowest rank.
    both = merged("model", {0: back, 1: back}).state_dict_metadata["model.w"]
    assert getattr(both, "chunks") == getattr(back.state_dict_metadata["model.w"], "chunks")  # noqa: B009

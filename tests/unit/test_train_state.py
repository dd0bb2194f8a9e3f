"""RNG and train-state components, the host snapshot, and the pre-load compatibility checks."""

from __future__ import annotations

import io
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from glue.train import RNGState, StateMismatchError, TrainState
from glue.train.checkpoint.snapshot import HostSnapshotter, check_compatible


def _draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.standard_normal()), torch.rand(3)


def test_rng_state_round_trips_every_stream_through_weights_only_load() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leave a cached gaussian in numpy's state
    rng = RNGState()
    buf = io.BytesIO()
    torch.save(rng.state_dict(), buf)
    expected = _draws()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    rng.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    got = _draws()
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_train_state_round_trip() -> None:
    t = TrainState(step=5, epoch=1, tokens_seen=640, extra={"best": 0.5})
    u = TrainState()
    u.load_state_dict(t.state_dict())
    assert u == t


def test_snapshot_is_independent_of_live_state_and_reuses_buffers() -> None:
    model = torch.nn.Linear(3, 2)
    snap = HostSnapshotter()
    first = snap.copy({"model": model.state_dict(), "meta": {"lr": [0.1], "t": (1, torch.ones(2))}})
    before = first["model"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    assert torch.equal(first["model"]["weight"], before), "the snapshot must not alias live tensors"
    assert isinstance(first["model"], OrderedDict)
    assert first["meta"]["lr"] == [0.1] and isinstance(first["meta"]["t"], tuple)
    second = snap.copy({"model": model.state_dict(), "meta": {"lr": [0.1], "t": (1, torch.ones(2))}})
    assert second["model"]["weight"].data_ptr() == first["model"]["weight"].data_ptr()  # reused
    assert torch.equal(second["model"]["weight"], model.weight.detach())


def test_snapshot_compacts_views() -> None:
    big = torch.arange(1000.0)
    out = HostSnapshotter().copy({"x": {"v": big[:10]}})
    assert out["x"]["v"].untyped_storage().nbytes() == 40  # torch.save would otherwise write all 4000 bytes


def test_module_mismatch_names_component_and_key() -> None:
    saved = torch.nn.Linear(4, 8).state_dict()
    with pytest.raises(StateMismatchError, match=r"'model', key 'weight': shape \[8, 4\].*\[16, 4\]"):
        check_compatible("model", saved, torch.nn.Linear(4, 16))
    missing = dict(saved)
    del missing["bias"]
    with pytest.raises(StateMismatchError, match="'bias': missing from the checkpoint"):
        check_compatible("model", missing, torch.nn.Linear(4, 8))
    extra = {**saved, "scale": torch.ones(1)}
    with pytest.raises(StateMismatchError, match="'scale': in the checkpoint but not in the model"):
        check_compatible("model", extra, torch.nn.Linear(4, 8))
    with pytest.raises(StateMismatchError, match="dtype"):
        check_compatible("model", {k: v.double() for k, v in saved.items()}, torch.nn.Linear(4, 8))
    check_compatible("model", saved, torch.nn.Linear(4, 8))


def test_optimizer_mismatch_is_caught_before_loading() -> None:
    a = torch.nn.Linear(4, 8)
    opt_a = torch.optim.Adam(a.parameters())
    a(torch.ones(1, 4)).sum().backward()
    opt_a.step()
    b = torch.nn.Linear(4, 16)
    with pytest.raises(StateMismatchError, match=r"'optimizer', key 'state.0.exp_avg': shape \[8, 4\]"):
        check_compatible("optimizer", opt_a.state_dict(), torch.optim.Adam(b.parameters()))
    c = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    with pytest.raises(StateMismatchError, match=r"param_groups.0.params"):
        check_compatible("optimizer", opt_a.state_dict(), torch.optim.Adam(c.parameters()))
    check_compatible("optimizer", opt_a.state_dict(), torch.optim.Adam(torch.nn.Linear(4, 8).parameters()))

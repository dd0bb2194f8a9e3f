"""ResumableSampler: deterministic per-epoch order, sharding, and resuming at any sample."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glue.train import ResumableSampler


def test_order_is_a_function_of_seed_and_epoch() -> None:
    a, b = ResumableSampler(20, seed=3), ResumableSampler(20, seed=3)
    first = list(a)
    assert first == list(b) and sorted(first) == list(range(20))
    assert a.epoch == 1 and a.index == 0  # finished epoch 0 moves on by itself
    assert list(a) != first  # epoch 1 is a different permutation
    assert list(ResumableSampler(20, seed=4)) != first


def test_resume_mid_epoch_continues_the_same_stream() -> None:
    ref = ResumableSampler(13, seed=1)
    stream = list(itertools.islice(itertools.chain(ref, ref, ref), 30))
    s = ResumableSampler(13, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = s.state_dict()
    assert state["epoch"] == 0 and state["index"] == 7
    r = ResumableSampler(13, seed=99)  # its own seed is replaced by the checkpoint's
    r.load_state_dict(state)
    rest = list(itertools.islice(itertools.chain(r, r, r), 23))
    assert head + rest == stream


def test_end_of_epoch_position_resumes_into_next_epoch() -> None:
    s = ResumableSampler(5, seed=0)
    it = iter(s)
    for _ in range(5):
        next(it)
    assert (s.epoch, s.index) == (0, 5)  # generator not yet exhausted
    ref = ResumableSampler(5, seed=0)
    list(ref)
    epoch1 = list(ref)
    r = ResumableSampler(5, seed=0)
    r.load_state_dict(s.state_dict())
    assert list(r) == []  # nothing left of epoch 0 ...
    assert r.epoch == 1
    assert list(r) == epoch1  # ... and then exactly epoch 1


def test_shards_are_disjoint_equal_and_cover() -> None:
    shards = [list(ResumableSampler(10, seed=5, rank=r, world_size=3)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert set().union(*shards) == set(range(10))  # padded by wrapping, like DistributedSampler
    assert len(ResumableSampler(10, rank=0, world_size=3)) == 4
    with pytest.raises(ValueError, match="outside world_size"):
        ResumableSampler(10, rank=3, world_size=3)


def test_set_epoch_keeps_position_for_the_current_epoch() -> None:
    s = ResumableSampler(8)
    it = iter(s)
    next(it), next(it)
    s.set_epoch(0)
    assert s.index == 2
    s.set_epoch(4)
    assert (s.epoch, s.index) == (4, 0)


def test_checkpoint_check_flags_a_different_dataset_or_world() -> None:
    s = ResumableSampler(10, world_size=2)
    state = ResumableSampler(12).state_dict()
    problems = dict(s.checkpoint_check(state))
    assert "n" in problems and "world_size" in problems


def test_dataloader_position_counts_consumed_batches() -> None:
    data = TensorDataset(torch.arange(10).float())
    s = ResumableSampler(data, seed=2)
    loader = DataLoader(data, batch_size=4, sampler=s, generator=torch.Generator())
    it = iter(loader)
    next(it)
    assert s.index == 4
    next(it)
    assert s.index == 8
    next(it)  # the partial last batch exhausts the epoch
    assert (s.epoch, s.index) == (1, 0)

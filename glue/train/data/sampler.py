"""A sampler whose position can be saved and restored mid-epoch.

The order of epoch e is a permutation drawn from `seed + e` alone, so it can be rebuilt anywhere;
the position is (epoch, index into this rank's share of that order). Iterating to the end of an
epoch moves on to the next one by itself, so `while True: yield from loader` runs across epochs.

Worker processes prefetch: the indices handed out run ahead of the batches the loop received.
glue.train.ResumableLoader feeds the consumed batches back (`_fed_back`), so the position is what
the loop received; iterated by any other multi-worker loader the sampler refuses.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sized
from types import FrameType
from typing import Any

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Deterministic per-epoch shuffle, sharded over ranks, resumable at any sample.

    With a plain `DataLoader(num_workers=0)` the position is exactly what the loop consumed; with
    worker processes use `glue.train.ResumableLoader` (or torchdata's StatefulDataLoader).
    Pass `generator=torch.Generator()` to the DataLoader: creating an iterator draws a seed from the
    global torch RNG otherwise, and a resumed run creates one at a different moment.
    """

    checkpoint_per_rank = True

    def __init__(
        self,
        data: Sized | int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.n = data if isinstance(data, int) else len(data)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.index = 0  # samples of this epoch the loop has received on this rank
        self._fed_back = False  # set by ResumableLoader: it advances the position, not __iter__

    def _order(self, epoch: int) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        # Pad by wrapping so every rank gets the same number of samples (as DistributedSampler does).
        per_rank = -(-self.n // self.world_size)
        total = per_rank * self.world_size
        if total > len(order) and order:
            order = (order * (total // len(order) + 1))[:total]
        return order[self.rank : total : self.world_size]

    def __len__(self) -> int:
        return -(-self.n // self.world_size)

    def __iter__(self) -> Iterator[int]:
        order = self._order(self.epoch)
        if self._fed_back:
            yield from order[self.index :]
            return
        _refuse_prefetching_loader()
        while self.index < len(order):
            i = order[self.index]
            self.index += 1
            yield i
        self.epoch += 1
        self.index = 0

    def _consumed(self, samples: int) -> None:
        self.index = min(self.index + samples, len(self))

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.index = 0

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler-compatible. Setting the current epoch again keeps the position."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.index = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "n": self.n,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))

    def checkpoint_reshard(self, states: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
        """This rank's state from every rank's state of a run at another world size.

        The ranks of the saved run were in lockstep, so together they had consumed the first
        index * old_world_size samples of the epoch's order: that global position is split over this
        run's ranks, so no sample is skipped or repeated. It must divide evenly (CheckpointError if not).
        """
        from glue.train.errors import CheckpointError

        positions = {(int(s["epoch"]), int(s["index"])) for s in states}
        if len(positions) != 1:
            raise CheckpointError(f"the saved ranks' data positions differ ({sorted(positions)}): not in lockstep, "
                                  "so no global sample position can be derived")
        if (rank, world_size) != (self.rank, self.world_size):
            raise CheckpointError(f"this sampler is rank {self.rank} of {self.world_size}, the checkpointer's "
                                  f"rank {rank} of {world_size}")
        epoch, index = positions.pop()
        consumed = index * len(states)
        if consumed >= self.n:  # the saved epoch was used up (the rest was padding)
            epoch, consumed = epoch + 1, 0
        if consumed % self.world_size:
            raise CheckpointError(
                f"the data position (sample {consumed} of epoch {epoch}, saved by {len(states)} ranks) cannot be split "
                f"evenly over {self.world_size} ranks: resume on a number of ranks that divides {consumed}")
        return {**states[0], "epoch": epoch, "index": consumed // self.world_size, "rank": self.rank,
                "world_size": self.world_size}

    def checkpoint_check(self, state: dict[str, Any]) -> list[tuple[str, str]]:
        """Problems that make `state` unusable here, as (key, what); checked before anything loads."""
        problems = []
        for key, live in (("n", self.n), ("world_size", self.world_size), ("rank", self.rank)):
            if key in state and int(state[key]) != live:
                problems.append((key, f"checkpoint has {state[key]}, this run has {live}"))
        return problems


def _refuse_prefetching_loader() -> None:
    # Called from the first next() of __iter__: the frames above are the loader's iterator.
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if type(owner).__name__.endswith("MultiProcessingDataLoaderIter"):
            raise ValueError(
                "ResumableSampler in a DataLoader with worker processes would save a prefetched position:"
                " use glue.train.ResumableLoader(dataset, sampler=..., num_workers=N) instead"
            )
        frame = frame.f_back

"""A sampler whose position can be saved and restored mid-epoch.

The order of epoch e is a permutation drawn from `seed + e` alone, so it can be rebuilt anywhere;
the position is (epoch, index into this rank's share of that order). Iterating to the end of an
epoch moves on to the next one by itself, so `while True: yield from loader` runs across epochs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Deterministic per-epoch shuffle, sharded over ranks, resumable at any sample.

    The position counts indices handed to the DataLoader. With `num_workers=0` that is exactly what
    the loop consumed; with worker processes (which prefetch) use torchdata's StatefulDataLoader.
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
        self.index = 0  # samples of this epoch already handed out on this rank

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
        while self.index < len(order):
            i = order[self.index]
            self.index += 1
            yield i
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

    def checkpoint_check(self, state: dict[str, Any]) -> list[tuple[str, str]]:
        """Problems that make `state` unusable here, as (key, what); checked before anything loads."""
        problems = []
        for key, live in (("n", self.n), ("world_size", self.world_size), ("rank", self.rank)):
            if key in state and int(state[key]) != live:
                problems.append((key, f"checkpoint has {state[key]}, this run has {live}"))
        return problems

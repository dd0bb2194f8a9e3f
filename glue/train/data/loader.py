"""A DataLoader whose data position and worker randomness resume exactly.

Two things break a bitwise resume once worker processes load the data:
- Workers prefetch, so the indices handed out run ahead of the batches the loop received. Here the
  ResumableSampler advances only as batches reach the loop.
- A worker's random streams (torch, NumPy, Python) depend on its seed, which batches it was given
  and everything it drew before; none of that survives a restart. Here every sample is loaded with
  those streams seeded from (seed, rank, epoch, position), so augmentation inside a Dataset draws
  the same numbers for the same sample whatever the worker, the prefetch depth or a restart.
  With `num_workers=0` the Dataset runs in the main process on the global streams, which
  RNGState saves, so nothing is reseeded there.

For torchdata's StatefulDataLoader wrap the dataset in WorkerRNG instead: that loader saves each
worker's dataset state, and WorkerRNG makes the worker's random streams that state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from glue.train.data.sampler import ResumableSampler
from glue.train.loop_state import host_rng_state, load_host_rng_state, seed_all

_MASK64 = (1 << 64) - 1


def sample_seed(seed: int, rank: int, epoch: int, position: int) -> int:
    """A well-mixed 63-bit seed for one sample (splitmix64 over the four coordinates)."""
    x = 0
    for part in (seed, rank, epoch, position):
        x = (x ^ (part & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
        x ^= x >> 31
    return x >> 1


class _KeyedSampler(Sampler[tuple[int, int]]):
    """Yields (index, the seed to load it with) in the ResumableSampler's order."""

    def __init__(self, sampler: ResumableSampler, seed: int | None) -> None:
        self.sampler = sampler
        self.seed = seed  # None: the sampler's seed, which a restore may have replaced

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        s = self.sampler
        epoch, start = s.epoch, s.index
        seed = s.seed if self.seed is None else self.seed
        for k, i in enumerate(s):
            yield i, sample_seed(seed, s.rank, epoch, start + k)


class _SeededDataset(Dataset[Any]):
    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        seed_all(seed)
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


class ResumableLoader(DataLoader[Any]):
    """`DataLoader(dataset, sampler=ResumableSampler(...), ...)` that resumes exactly with workers.

    Register the sampler (or this loader) with the Checkpointer: its position counts the samples of
    batches this loader has yielded. `seed` seeds the per-sample random streams in the workers
    (default: the sampler's seed, restored with it). A generator of its own is used so that creating an iterator never
    draws from the global torch RNG.
    """

    checkpoint_per_rank = True

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        sampler: ResumableSampler,
        batch_size: int = 1,
        num_workers: int = 0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"ResumableLoader needs a ResumableSampler, got {type(sampler).__name__}")
        for bad in ("batch_sampler", "shuffle"):
            if kwargs.get(bad) is not None:
                raise ValueError(f"ResumableLoader takes no {bad}=: the ResumableSampler decides the order")
        if kwargs.get("generator") is None:
            kwargs["generator"] = torch.Generator()
        self.resumable_sampler = sampler
        self.worker_seed = seed
        sampler._fed_back = True
        if num_workers > 0:
            super().__init__(
                _SeededDataset(dataset),
                sampler=_KeyedSampler(sampler, self.worker_seed),
                batch_size=batch_size,
                num_workers=num_workers,
                **kwargs,
            )
        else:
            super().__init__(dataset, sampler=sampler, batch_size=batch_size, num_workers=0, **kwargs)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        s = self.resumable_sampler
        step = self.batch_size or 1
        for batch in super().__iter__():
            s._consumed(step)
            yield batch
        s._next_epoch()

    def close(self) -> None:
        """Stop the worker processes now. With persistent_workers they outlive each epoch and are
        stopped only when the loader is garbage collected; collected inside a reference cycle (a loop
        in a notebook or a test), torch can no longer signal them and waits 5 s per worker before
        killing them. Iterating again after close() starts new workers."""
        it, self._iterator = self._iterator, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.resumable_sampler.state_dict(), "worker_seed": self.worker_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resumable_sampler.load_state_dict(state["sampler"])
        seed = state.get("worker_seed")
        self.worker_seed = None if seed is None else int(seed)
        if isinstance(self.sampler, _KeyedSampler):
            self.sampler.seed = self.worker_seed

    def checkpoint_reshard(self, states: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
        """At another world size: the sampler's global position split anew (ResumableSampler); the
        worker seed is the saved run's (the same on every rank)."""
        sampler = self.resumable_sampler.checkpoint_reshard([s["sampler"] for s in states], rank, world_size)
        return {"sampler": sampler, "worker_seed": states[0].get("worker_seed")}

    def checkpoint_check(self, state: dict[str, Any]) -> list[tuple[str, str]]:
        return self.resumable_sampler.checkpoint_check(state.get("sampler", {}))


class WorkerRNG(Dataset[Any]):
    """Wraps a Dataset so torchdata's StatefulDataLoader saves and restores each worker's random
    streams (torch, NumPy, Python) with the worker's dataset state. In the main process
    (`num_workers=0`) it saves nothing: RNGState already holds those streams."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        if get_worker_info() is None:
            return {}
        return host_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state or get_worker_info() is None:
            return
        load_host_rng_state(state)


class LoaderRNG:
    """A DataLoader's `generator` (it draws each iterator's worker base seed), for StatefulDataLoader.

    Saved as it was just before the current iterator was created: a resume creates that iterator
    again, which draws once more, so the next epoch's workers get the seeds they would have had.
    Give the shuffle its own generator (`sampler=RandomSampler(ds, generator=...)`, saved by the
    loader with the sampler) so that this one draws nothing else.
    """

    checkpoint_per_rank = True

    def __init__(self, loader: DataLoader[Any]) -> None:
        gen = loader.generator
        if gen is None:
            raise ValueError("LoaderRNG needs DataLoader(generator=torch.Generator()); without one the loader"
                             " draws its worker seeds from the global torch RNG")
        self.generator: torch.Generator = gen
        self._at_iter = gen.get_state()
        create = loader._get_iterator

        def capture() -> Any:
            self._at_iter = gen.get_state()
            return create()

        loader._get_iterator = capture  # type: ignore[method-assign]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self._at_iter.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._at_iter = state["generator"]

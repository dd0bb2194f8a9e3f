"""State components that are not already torch objects: the RNG streams and the loop's counters."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

log = logging.getLogger("glue.train")


class RNGState:
    """Python `random`, NumPy's global generator, torch CPU and every CUDA device.

    Per rank by default: in data parallel training each rank draws its own streams (dropout
    masks, augmentation), so each rank must get its own back.
    """

    checkpoint_per_rank = True

    def state_dict(self) -> dict[str, Any]:
        state = host_rng_state()
        if torch.cuda.is_available():
            # Generator state is host-side: this creates no context on the other devices.
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_host_rng_state(state)
        cuda = state.get("cuda") or []
        if torch.cuda.is_available():
            have = torch.cuda.device_count()
            if len(cuda) != have:
                log.warning("checkpoint has RNG state for %d CUDA devices, this machine has %d", len(cuda), have)
            for i, st in enumerate(cuda[:have]):
                torch.cuda.set_rng_state(st, i)
        elif cuda:
            log.warning("checkpoint has CUDA RNG state but CUDA is not available here; not restored")

    def checkpoint_reshard(self, states: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
        """At another world size: rank r continues saved rank r's streams; a rank the saved run did not
        have keeps the streams it was started with (its own seeding), as a fresh rank would."""
        return states[rank] if rank < len(states) else self.state_dict()


def seed_all(seed: int) -> None:
    """Seed every stream RNGState saves (python's, numpy's, torch's on every device): two runs of a job
    start alike, so a drill compares them bitwise, random streams included."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.manual_seed(seed)


def host_rng_state() -> dict[str, Any]:
    """This process's Python, NumPy and torch CPU streams, as types torch.load(weights_only=True) reads."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }


def load_host_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        (
            npst["name"],
            npst["keys"].numpy().astype(np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])


@dataclass
class TrainState:
    """The loop's own counters. `extra` holds any other small JSON-like values (best loss, ...)."""

    step: int = 0
    epoch: int = 0
    tokens_seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "tokens_seen": self.tokens_seen, "extra": dict(self.extra)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.tokens_seen = int(state["tokens_seen"])
        self.extra = dict(state.get("extra", {}))

"""The README's loop with worker processes, run as its own process by the worker-resume tests.

`python -m tests.integration.ckpt_workers_loop OUT TARGET --loader kit|sdl --workers N [--persistent]
--steps T [--stop K]`: trains T steps (AdamW, a scheduler, dropout, a Dataset that augments with torch,
NumPy and Python randomness), saving every `--save-every` steps; with --stop it saves step K, waits for
the commit and dies with os._exit (no cleanup, like a kill). Writes {"losses": {step: hex}, "model":
sha256} to OUT at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from glue.train import (
    Checkpointer,
    LoaderRNG,
    ResumableLoader,
    ResumableSampler,
    RNGState,
    TrainState,
    WorkerRNG,
    layout,
)

N_SAMPLES, BATCH = 40, 4  # 10 steps per epoch


class AugmentedData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed data, augmented with all three random streams a Dataset typically uses."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N_SAMPLES, 8, generator=g)
        self.y = torch.randint(0, 4, (N_SAMPLES,), generator=g)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(8) * 0.1 + float(np.random.rand()) * 0.1 + random.random() * 0.1
        return self.x[i] + noise, self.y[i]


def make_loader(kind: str, workers: int, persistent: bool, seed: int, bare: bool) -> tuple[Any, list[Any]]:
    """(loader, the components that hold the data position and the loader's randomness)."""
    ds = AugmentedData()
    opts: dict[str, Any] = {"num_workers": workers, "persistent_workers": persistent and workers > 0}
    if kind == "kit":
        sampler = ResumableSampler(ds, seed=seed)
        return ResumableLoader(ds, sampler=sampler, batch_size=BATCH, **opts), [sampler]
    if kind == "plain":
        sampler = ResumableSampler(ds, seed=seed)
        return DataLoader(ds, sampler=sampler, batch_size=BATCH, generator=torch.Generator(), **opts), [sampler]
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler

    # The shuffle's generator is the sampler's own (saved with it); the loader's only seeds workers.
    order = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    loader = StatefulDataLoader(ds if bare else WorkerRNG(ds), batch_size=BATCH, sampler=order,
                                generator=torch.Generator().manual_seed(seed + 1), **opts)
    return loader, [loader] if bare else [loader, LoaderRNG(loader)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("target")
    ap.add_argument("--loader", choices=["kit", "plain", "sdl"], default="kit")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--stop", type=int)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (kill storms land mid-run)")
    ap.add_argument("--bare-dataset", action="store_true", help="sdl without WorkerRNG (diverges)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    commits = f"{layout.CKPT_PREFIX}step-*/{layout.COMMIT}"
    resuming = any(Path(args.target).glob(commits))  # a first save may have been cut off
    seed = 999 if resuming else 0  # whatever matches after a resume came from the checkpoint
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    loader, data = make_loader(args.loader, args.workers, args.persistent, seed, args.bare_dataset)
    train = TrainState()
    ck = Checkpointer(args.target, keep_last=2)
    comps = [("model", model), ("optimizer", opt), ("scheduler", sched), ("data", data[0]),
             ("rng", RNGState()), ("train", train)] + [("loader_rng", obj) for obj in data[1:]]
    for name, obj in comps:
        ck.register(name, obj)
    step = ck.restore() or 0

    def batches() -> Iterator[Any]:
        while True:
            yield from loader

    losses: dict[int, str] = {}
    for x, y in batches():
        if step == args.steps:
            break
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        train.step = step
        losses[step] = float(loss.item()).hex()
        print("step", step, flush=True)  # a kill storm paces its kills by these
        if step == args.stop:
            ck.save(step, blocking=True)
            os._exit(0)  # no cleanup, no flush: as if killed right after the commit
        if args.save_every and step % args.save_every == 0:
            ck.save(step)
        time.sleep(args.step_sleep)
    ck.close()
    blob = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "model": hashlib.sha256(blob).hexdigest()}, f)


if __name__ == "__main__":
    main()

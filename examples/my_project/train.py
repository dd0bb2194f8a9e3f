"""The example user trainer: its model and data come from mylib/ (this folder), its einops from
requirements.txt, and glue.train makes it resumable (checkpoints, data position, RNG, heartbeat)."""

from __future__ import annotations

import io
import random
import time

import numpy as np
import torch
import torch.nn.functional as F

from glue.train import ResumableLoader, ResumableSampler, RNGState, TrainState
from glue.train import RunContext
from mylib.data import make_dataset
from mylib.model import Regressor


def main() -> None:
    with RunContext.from_env() as ctx:
        cfg = ctx.config
        steps = int(cfg.get("steps", 60))
        interval = int(cfg.get("checkpoint_interval", ctx.checkpoint_interval))
        random.seed(0)  # every stream RNGState saves starts the same: a resumed run ends bitwise equal
        np.random.seed(0)
        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        data = make_dataset()
        model = Regressor(features=data.tensors[0].shape[1], hidden=int(cfg.get("hidden", 32)))
        opt = torch.optim.AdamW(model.parameters(), lr=float(cfg.get("lr", 0.01)))
        sampler = ResumableSampler(data, seed=0)
        loader = ResumableLoader(data, sampler=sampler, batch_size=int(cfg.get("batch_size", 16)))
        train = TrainState()
        ckpt = ctx.checkpointer()
        for name, obj in [("model", model), ("optimizer", opt), ("data", sampler), ("rng", RNGState()),
                          ("train", train)]:
            ckpt.register(name, obj)
        step = (ckpt.restore() or 0) if ctx.resume else 0
        print(f"starting at step {step} of {steps}", flush=True)

        def batches():
            while True:
                yield from loader

        for x, y in batches():
            if step >= steps:
                break
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            train.step = step
            ctx.step(step, loss.item())
            time.sleep(float(cfg.get("step_sleep", 0)))
            if step % interval == 0 or step == steps:
                ckpt.save(step)
        ckpt.close()
        loader.close()
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        ctx.write_output("model.pt", buf.getvalue())
        print(f"done at step {step}", flush=True)


if __name__ == "__main__":
    main()

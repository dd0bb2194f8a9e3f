"""A Lightning job kept going by gpukit: a small MLP with dropout on generated data (nothing downloaded).
GlueCheckpointIO seals every .ckpt into the bucket; GlueCallback keeps the random streams in each
checkpoint and reports every step's loss; torchdata's StatefulDataLoader keeps the data position."""

from __future__ import annotations

import json
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from glue.train import RunContext
from glue.train.integrations.lightning import GlueCallback, GlueCheckpointIO, resume_checkpoint


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int, lr: float, pace: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(hidden, 1))
        self.lr, self.pace = lr, pace

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.pace:
            time.sleep(self.pace)  # config.step_sleep: changes no loss, lets a test lose the VM mid-run
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    with RunContext.from_env() as ctx:
        cfg = ctx.config
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(2048, 16, generator=g)
        y = (x @ torch.randn(16, 1, generator=g)).tanh() + 0.05 * torch.randn(2048, 1, generator=g)
        loader = StatefulDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=int(cfg.get("batch_size", 16)),
                                    shuffle=True, generator=torch.Generator().manual_seed(7))
        pl.seed_everything(0)
        model = Regressor(int(cfg.get("hidden", 64)), float(cfg.get("lr", 1e-2)), float(cfg.get("step_sleep", 0.0)))
        folder = str(ctx.scratch / "lightning")  # the VM's own disk: gone with the VM, the bucket keeps the seals
        io, callback = GlueCheckpointIO(ctx), GlueCallback(ctx)
        every = ModelCheckpoint(dirpath=folder, every_n_train_steps=ctx.checkpoint_interval, save_top_k=-1)
        trainer = pl.Trainer(max_steps=int(cfg.get("steps", 60)), accelerator="cpu", logger=False,
                             enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                             plugins=[io], callbacks=[callback, every])
        start = resume_checkpoint(io, folder) if ctx.resume else None
        print(f"resuming from sealed checkpoint {start}" if start else "starting fresh", flush=True)
        trainer.fit(model, loader, ckpt_path=start)
        ctx.write_output("final.json", json.dumps({"step": trainer.global_step}).encode())


if __name__ == "__main__":
    main()

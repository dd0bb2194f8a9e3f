"""A Hugging Face Trainer run kept going by gpukit: a small GPT-2 built from a config (random weights)
on generated tokens, so nothing is downloaded. GlueCallback seals each checkpoint-<N>/ the Trainer saves
into the bucket and reports every step's loss; a new VM resumes from the newest valid one."""

from __future__ import annotations

import json
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from glue.train import RunContext
from glue.train.integrations.hf import GlueCallback, resume_checkpoint


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Generated token sequences: a fixed random walk over the vocabulary, learnable and reproducible."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(1234)
        steps = torch.randint(-2, 3, (n, seq), generator=g)
        self.x = (torch.randint(0, vocab, (n, 1), generator=g) + steps.cumsum(1)) % vocab

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Pace(TrainerCallback):
    """config.step_sleep: a pause per step (changes no loss), so a test can lose the VM mid-run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def main() -> None:
    with RunContext.from_env() as ctx:
        cfg = ctx.config
        vocab, seq = int(cfg.get("vocab", 64)), int(cfg.get("seq_len", 32))
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=int(cfg.get("d_model", 64)),
                            n_layer=int(cfg.get("n_layer", 2)), n_head=4, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config)
        out = str(ctx.scratch / "hf-trainer")  # the VM's own disk: gone with the VM, the bucket keeps the seals
        args = TrainingArguments(output_dir=out, max_steps=int(cfg.get("steps", 60)),
                                 per_device_train_batch_size=int(cfg.get("batch_size", 8)),
                                 learning_rate=float(cfg.get("lr", 1e-3)), save_steps=ctx.checkpoint_interval,
                                 save_total_limit=2, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                                 disable_tqdm=True)
        callback = GlueCallback(ctx)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(512, seq, vocab),
                          callbacks=[callback, Pace(float(cfg.get("step_sleep", 0.0)))])
        start = resume_checkpoint(callback, out) if ctx.resume else None
        print(f"resuming from sealed checkpoint {start}" if start else "starting fresh", flush=True)
        trainer.train(resume_from_checkpoint=start)
        ctx.write_output("final.json", json.dumps({"step": trainer.state.global_step,
                                                   "loss": callback.losses.get(trainer.state.global_step)}).encode())


if __name__ == "__main__":
    main()

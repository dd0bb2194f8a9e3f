"""Framework checkpoint figures (issue 34): the step-time overhead of sealing a Trainer's checkpoints.

    .venv/bin/python bench/framework_overhead.py [--steps 200] [--save-every 50]

The same Hugging Face Trainer run (a GPT-2 built from a config, generated tokens, CPU) twice, in one
process: saving its checkpoint-<N>/ folders to local disk only (the baseline), and with
glue.train.integrations.hf.GlueCallback sealing each one into a fresh local `rclone serve s3` bucket
on 127.0.0.1 (the files read on the training thread, upload and commit in the background). Reported:
wall time per step of each and the ratio (goal: overhead <= 2%), the seconds one background seal
takes and the bytes it moves. Runs alternate (baseline, sealed, baseline, sealed, ...) so
load from anything else on the machine hits both alike; medians are reported.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from glue.cloud.local.bucket import LocalBucket
from glue.train import layout
from glue.train.checkpoint.sealed import FolderCheckpoints


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.x = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _run(out: Path, steps: int, every: int, callbacks: list[Any]) -> float:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=256, n_layer=4, n_head=4,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=8, save_steps=every,
                             save_total_limit=2, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                             disable_tqdm=True, log_level="error")
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(4096, 64, 512), callbacks=callbacks)
    t = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    from glue.train.integrations.hf import GlueCallback

    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-framework-"))
    bucket = LocalBucket(home)
    info = bucket.ensure_running()
    creds = bucket.credentials()
    base: list[float] = []
    sealed: list[float] = []
    seals: list[tuple[float, int]] = []
    try:
        for i in range(args.repeats):
            base.append(_run(home / f"base-{i}", args.steps, args.save_every, []))
            target = FolderCheckpoints(layout.run_uri(info.name, f"bench-{i}"), endpoint_url=info.endpoint,
                                       credentials=lambda: creds)
            timed = _Timed(target, seals)
            sealed.append(_run(home / f"sealed-{i}", args.steps, args.save_every, [GlueCallback(sealed=timed)]))
            target.close()
            shutil.rmtree(home / f"base-{i}", ignore_errors=True)
            shutil.rmtree(home / f"sealed-{i}", ignore_errors=True)
    finally:
        bucket.stop()
    b, s = statistics.median(base), statistics.median(sealed)
    seal_s = statistics.median(t for t, _ in seals)
    print(f"{args.steps} steps, a checkpoint every {args.save_every}; one seal: {seal_s:.3f}s, "
          f"{statistics.median(n for _, n in seals) / 1e6:.1f} MB")
    print(f"{'figure':<36}{'sealed':>10}{'baseline':>11}{'ratio':>9}  goal")
    print(f"{'wall time per step':<36}{s / args.steps * 1e3:>8.1f}ms{b / args.steps * 1e3:>9.1f}ms"
          f"{s / b:>8.3f}x  <= 1.02x")


class _Timed(FolderCheckpoints):
    """The same sealing, timed (seconds and bytes of each seal)."""

    def __init__(self, inner: FolderCheckpoints, into: list[tuple[float, int]]) -> None:
        self.__dict__.update(inner.__dict__)
        self._into = into

    def _commit(self, step: int, body: list[tuple[str, bytes]]) -> Any:
        t = time.perf_counter()
        commit = super()._commit(step, body)
        self._into.append((time.perf_counter() - t, sum(o.size for o in commit.objects())))
        return commit


if __name__ == "__main__":
    main()

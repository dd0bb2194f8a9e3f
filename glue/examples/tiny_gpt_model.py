"""tiny_gpt's model, its data as windows of the generated corpus, its held-out evaluation, and the
FSDP2 sharding of it; the training loop and the settings are glue.examples.tiny_gpt's."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from glue.examples.corpus import generate


class CharWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, ids: torch.Tensor, seq_len: int) -> None:
        self.ids, self.seq_len = ids, seq_len

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = i * self.seq_len
        return self.ids[s: s + self.seq_len], self.ids[s + 1: s + self.seq_len + 1]


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, cfg: dict[str, Any]) -> None:
        super().__init__()
        d = int(cfg["d_model"])
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(int(cfg["seq_len"]), d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, int(cfg["n_head"]), 4 * d, float(cfg["dropout"]), batch_first=True,
                                       norm_first=True)
            for _ in range(int(cfg["n_layer"]))
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.activation_checkpointing = bool(cfg.get("checkpointing"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(block, h, mask, None, True, use_reentrant=False)
            else:
                h = block(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


def build(cfg: dict[str, Any]) -> tuple[TinyGPT, CharWindows, int]:
    text = generate(int(cfg["corpus_chars"]))
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(int(cfg["seed"]))
    model = TinyGPT(len(vocab), cfg)
    return model, CharWindows(ids, int(cfg["seq_len"])), len(vocab)


# A seed the training corpus (glue.examples.corpus, seed 1234) never uses: held-out sentences.
HELDOUT_SEED = 98765


def heldout_ids(cfg: dict[str, Any], data: bytes | None = None) -> torch.Tensor:
    """The evaluation set as token ids: the pinned set's text when given, else generated held-out text.
    Characters outside the training vocabulary are dropped (the model cannot predict them)."""
    vocab = sorted(set(generate(int(cfg["corpus_chars"]))))
    index = {c: i for i, c in enumerate(vocab)}
    text = data.decode("utf-8", errors="replace") if data is not None else generate(int(cfg["eval_chars"]),
                                                                                    seed=HELDOUT_SEED)
    return torch.tensor([index[c] for c in text if c in index], dtype=torch.long)


def evaluate(model: nn.Module, ids: torch.Tensor, cfg: dict[str, Any], device: torch.device) -> dict[str, float]:
    """Mean next-character cross-entropy over every full window of the held-out set (no dropout, no RNG
    drawn: evaluating does not change what training does next)."""
    seq = int(cfg["seq_len"])
    windows = CharWindows(ids, seq)
    if len(windows) == 0:
        raise ValueError(f"the evaluation set holds {len(ids)} known characters, fewer than one window "
                         f"(seq_len {seq} + 1)")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), 32):
            xs, ys = zip(*(windows[i] for i in range(start, min(start + 32, len(windows)))), strict=True)
            x, y = torch.stack(xs).to(device), torch.stack(ys).to(device)
            logits = model(x)
            total += float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                                       reduction="sum"))
            count += y.numel()
    model.train(was_training)
    loss = total / count
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}


def shard(model: TinyGPT, device: torch.device) -> None:
    """FSDP2: each block, then the rest of the model, sharded over every rank (a one-rank group when the
    run has none: the checkpoints are sharded ones whatever the world size, so a run can change it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():  # FSDP2's collectives on CUDA tensors need NCCL; gloo serves the CPU
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_state(model: nn.Module) -> dict[str, Any]:
    """The whole model's parameters on the CPU (sharded: gathered; every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

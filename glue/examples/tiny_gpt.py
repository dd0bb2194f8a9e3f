"""tiny_gpt: a character-level transformer on a generated corpus, checkpointed with glue.train.

Deployed by `glue deploy` it reads its settings from the run (GPUKIT_CONFIG) and reports per-step
loss, heartbeat and metrics to the bucket. Standalone:

    python -m glue.examples.tiny_gpt --config '{"steps": 50}' --checkpoint /tmp/ck [--resume]

Sized by config (d_model, n_layer, seq_len, batch_size) so it can be made to run out of memory.
Under torchrun (WORLD_SIZE > 1) it trains data parallel (DDP; gloo on CPU, nccl on CUDA): every rank
reads its own shard, and before the first step the ranks all-gather config hash, world size, code
version and restored checkpoint step (glue.train.run.agreement) and stop on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from glue.examples.tiny_gpt_model import TinyGPT, build, evaluate, full_state, heldout_ids, shard
from glue.train import Checkpointer, OptimizerState, ResumableSampler, RNGState, TrainState, trainer_vars
from glue.train.run.agreement import agree
from glue.train.run.evaluation import load_eval_set, record_evaluation
from glue.train.run.process_group import join, under_torchrun

DEFAULTS: dict[str, Any] = {
    "steps": 100, "batch_size": 8, "seq_len": 64, "d_model": 64, "n_layer": 2, "n_head": 4, "dropout": 0.1,
    "lr": 3e-3, "warmup": 10, "seed": 0, "corpus_chars": 100_000, "device": "cpu", "threads": 1,
    # Test hooks: a deliberately broken resume, a run that never writes its outputs, a slow step.
    "broken_resume": None, "skip_outputs": False, "step_sleep": 0.0, "checkpoint_interval": 20,
    "grad_accum": 1, "checkpointing": False, "autocast_bf16": False, "adapter_only": False,
    "dist_timeout_s": 300, "log_dir": None,  # log_dir: a per-step log of the trainer's own, e.g. under /mnt/s3
    # Evaluation on a fixed held-out set (the run's pinned evaluation set, else generated text the training
    # corpus never holds): at the end, and every eval_every steps when > 0.
    "eval_every": 0, "eval_chars": 4000,
    # "fsdp": every block and the model sharded with FSDP2 (fully_shard): parameters, gradients and optimizer
    # state split over the ranks, checkpointed through torch DCP (glue.train's sharded path).
    "parallel": "ddp",
}


# key -> (type, lowest allowed value or None); `bool` is not an int here, an int is a float.
_SPEC: dict[str, tuple[type | tuple[type, ...], float | None]] = {
    "steps": (int, 1), "batch_size": (int, 1), "seq_len": (int, 1), "d_model": (int, 1), "n_layer": (int, 1),
    "n_head": (int, 1), "dropout": ((int, float), 0), "lr": ((int, float), 1e-12), "warmup": (int, 0),
    "seed": (int, 0), "corpus_chars": (int, 1000), "device": (str, None), "threads": (int, 1),
    "broken_resume": ((str, type(None)), None), "skip_outputs": (bool, None), "step_sleep": ((int, float), 0),
    "checkpoint_interval": (int, 1), "grad_accum": (int, 1), "checkpointing": (bool, None),
    "autocast_bf16": (bool, None), "adapter_only": (bool, None), "dist_timeout_s": ((int, float), 1),
    "log_dir": ((str, type(None)), None), "eval_every": (int, 0), "eval_chars": (int, 256), "parallel": (str, None),
}


class ConfigError(ValueError):
    """A bad `config:` value: said in one line, never as a traceback."""


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The trainer's own settings: known keys, right types, sane ranges; a ConfigError names the key."""
    for key in cfg:
        value: Any = cfg[key]
        if key not in _SPEC:
            raise ConfigError(f"unknown key {key!r} in config; known: {', '.join(sorted(_SPEC))}")
        kind, low = _SPEC[key]
        wrong = isinstance(value, bool) and kind is not bool
        if wrong or not isinstance(value, kind):
            names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise ConfigError(f"config.{key} must be {names}, got {value!r}")
        if low is not None and cfg[key] < low:  # cfg[key]: not narrowed by isinstance
            raise ConfigError(f"config.{key} must be >= {low:g}, got {value!r}")
    if cfg["dropout"] >= 1:
        raise ConfigError(f"config.dropout must be below 1, got {cfg['dropout']!r}")
    if cfg["d_model"] % cfg["n_head"]:
        raise ConfigError(f"config.d_model ({cfg['d_model']}) must be a multiple of config.n_head ({cfg['n_head']})")
    if cfg["parallel"] not in ("ddp", "fsdp"):
        raise ConfigError(f"config.parallel must be 'ddp' or 'fsdp', got {cfg['parallel']!r}")
    if cfg["device"] not in ("cpu", "cuda") and not str(cfg["device"]).startswith("cuda:"):
        raise ConfigError(f"config.device must be 'cpu', 'cuda' or 'cuda:N', got {cfg['device']!r}")
    return cfg


def init_distributed(cfg: dict[str, Any]) -> bool:
    """Join the torchrun group when there is one (a deployed run's RunContext already has)."""
    if not under_torchrun(dict(os.environ)):
        return False
    if not dist.is_initialized():
        join(timeout_s=float(cfg["dist_timeout_s"]))
    return True


def fingerprint(t: torch.Tensor, prev: str = "") -> str:
    return hashlib.sha256(prev.encode() + t.contiguous().numpy().tobytes()).hexdigest()[:16]


def batches(loader: DataLoader[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from loader


@dataclass
class _Parts:
    """What the loop trains, built once by _build_parts."""

    rank: int
    world: int
    device: torch.device
    model: TinyGPT
    net: nn.Module  # the model, or its DDP wrapper
    params: list[nn.Parameter]  # those that train
    opt: torch.optim.AdamW
    sched: torch.optim.lr_scheduler.LambdaLR
    sampler: ResumableSampler
    loader: DataLoader[Any]


def train(cfg: dict[str, Any], ckpt: Checkpointer | None, resume: bool, report: Any = None,
          heldout: torch.Tensor | None = None) -> dict[str, Any]:
    """The loop. Returns {"step", "loss"}; prints `step N loss L` (full precision) per step. With `report`
    (a RunContext) and `heldout` ids, rank 0 evaluates every eval_every steps and records the result."""
    parts = _build_parts(cfg)
    rng, ts = RNGState(), TrainState()
    restored = _register_and_restore(cfg, ckpt, resume, parts, rng, ts)
    agree(cfg, restored)  # every rank the same workload, or no rank trains
    steps, interval = int(cfg["steps"]), int(cfg["checkpoint_interval"])
    if cfg["log_dir"]:
        os.makedirs(str(cfg["log_dir"]), exist_ok=True)
    loss_value = float("nan")
    it = batches(parts.loader)
    parts.net.train()
    while ts.step < steps:
        loss_value, inputs = _step(cfg, parts, it, ts)
        _log_step(cfg, parts.rank, ts.step, loss_value, inputs, report)
        _evaluate_due(cfg, parts, ts.step, report, heldout)
        if cfg["step_sleep"]:
            import time

            time.sleep(float(cfg["step_sleep"]))
        if ckpt is not None and (ts.step % interval == 0 or ts.step == steps):
            ckpt.save(ts.step)
    if ckpt is not None:
        ckpt.flush()
    return {"step": ts.step, "loss": loss_value, "model": parts.model, "device": parts.device, "optimizer": parts.opt,
            "sampler": parts.sampler}


def _build_parts(cfg: dict[str, Any]) -> _Parts:
    """Seeded and deterministic: the model on this rank's device (frozen but the head when adapter_only;
    sharded or DDP-wrapped), its optimizer and schedule, and this rank's data."""
    torch.set_num_threads(int(cfg["threads"]))
    torch.use_deterministic_algorithms(True)
    random.seed(int(cfg["seed"]))
    np.random.seed(int(cfg["seed"]))
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    # device "cuda" under torchrun means this process's GPU (LOCAL_RANK); the config stays the same on
    # every rank, so its hash can be compared.
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cfg["device"] == "cuda" and world > 1 else str(cfg["device"]))
    model, data, _ = build(cfg)
    model.to(device)
    if cfg["adapter_only"]:
        for name, p in model.named_parameters():
            p.requires_grad = name.startswith("head.")
    net: nn.Module = model
    if cfg["parallel"] == "fsdp":
        shard(model, device)
    elif world > 1:
        # DDP averages gradients across ranks (of the parameters that train: wrap after freezing); the
        # checkpoint holds the plain module (rank 0 saves it).
        net = nn.parallel.DistributedDataParallel(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(cfg["lr"]), weight_decay=0.01)
    steps, warm = int(cfg["steps"]), int(cfg["warmup"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    sampler = ResumableSampler(data, seed=int(cfg["seed"]), rank=rank, world_size=world)
    loader = DataLoader(data, batch_size=int(cfg["batch_size"]), sampler=sampler, drop_last=True,
                        generator=torch.Generator())
    return _Parts(rank, world, device, model, net, params, opt, sched, sampler, loader)


def _register_and_restore(cfg: dict[str, Any], ckpt: Checkpointer | None, resume: bool, parts: _Parts,
                          rng: RNGState, ts: TrainState) -> int | None:
    """The checkpointed state (less the part a broken_resume test leaves out); with resume, restored.
    Returns the restored step, or None."""
    if ckpt is None:
        return None
    broken = cfg.get("broken_resume")
    optimizer = OptimizerState(parts.model, parts.opt) if cfg["parallel"] == "fsdp" else parts.opt
    comps: dict[str, Any] = {"model": parts.model, "optimizer": optimizer, "scheduler": parts.sched,
                             "data": parts.sampler, "rng": rng, "train": ts}
    for name, obj in comps.items():
        if name != {"skip_rng": "rng", "skip_data": "data"}.get(str(broken)):
            ckpt.register(name, obj)
    if not resume:
        return None
    restored = ckpt.restore()
    print(f"resumed from step {restored}" if restored is not None else "no checkpoint: starting fresh", flush=True)
    return restored


def _step(cfg: dict[str, Any], parts: _Parts, it: Iterator[tuple[torch.Tensor, torch.Tensor]],
          ts: TrainState) -> tuple[float, dict[str, str]]:
    """One optimizer step over grad_accum micro-batches. Returns its loss and fingerprints of its inputs."""
    accum = int(cfg["grad_accum"])
    parts.opt.zero_grad(set_to_none=True)
    loss_value = 0.0
    rng_fp = fingerprint(torch.get_rng_state())
    data_pos = f"{parts.sampler.epoch}:{parts.sampler.index * parts.world}"  # where its samples start (globally)
    batch_fp = ""
    for _ in range(accum):
        x, y = (t.to(parts.device) for t in next(it))
        batch_fp = fingerprint(x.cpu(), batch_fp)
        with torch.autocast(parts.device.type, dtype=torch.bfloat16, enabled=bool(cfg["autocast_bf16"])):
            logits = parts.net(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        (loss / accum).backward()
        loss_value += loss.item() / accum
        ts.tokens_seen += x.numel()
    torch.nn.utils.clip_grad_norm_(parts.params, 1.0)
    parts.opt.step()
    parts.sched.step()
    ts.step += 1
    ts.epoch = parts.sampler.epoch
    return loss_value, {"data": data_pos, "batch": batch_fp, "rng": rng_fp}


def _log_step(cfg: dict[str, Any], rank: int, step: int, loss_value: float, inputs: dict[str, str],
              report: Any) -> None:
    if rank == 0:
        print(f"step {step} loss {loss_value!r}", flush=True)
    if report is not None:
        # Fingerprints of the step's inputs let the drill say WHICH state a bad resume lost: `data` the
        # position (which samples), `batch` their contents (same position, other contents: worker RNG).
        report.step(step, loss_value, **inputs)
    if cfg["log_dir"] and rank == 0:  # what a user's own code does with the mount: logs, artifacts
        with open(os.path.join(str(cfg["log_dir"]), "steps.log"), "a") as fh:
            fh.write(f"{step} {loss_value!r}\n")


def _evaluate_due(cfg: dict[str, Any], parts: _Parts, step: int, report: Any, heldout: torch.Tensor | None) -> None:
    """Every eval_every steps but the last (the deployed run evaluates at the end)."""
    every, fsdp = int(cfg["eval_every"]), cfg["parallel"] == "fsdp"
    if report is not None and heldout is not None and (parts.rank == 0 or fsdp) and every and step % every == 0 \
            and step < int(cfg["steps"]):
        result = evaluate(parts.model, heldout, cfg, parts.device)  # sharded: every rank takes part in the forward
        if parts.rank == 0:
            record_evaluation(report, step, result)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="{}", help="JSON object overriding the defaults")
    ap.add_argument("--checkpoint", help="checkpoint target (standalone runs; deployed runs use the run's)")
    ap.add_argument("--resume", action="store_true", help="restore the latest valid checkpoint first")
    args = ap.parse_args(argv)
    cfg = dict(DEFAULTS)
    if trainer_vars.RUN in os.environ:
        try:
            return _deployed(args, cfg)
        except ConfigError as exc:  # recorded by the RunContext as the trainer's error (user_error); one line here
            print(f"tiny_gpt: {exc}", file=sys.stderr)
            return 2
    cfg.update(json.loads(args.config))
    try:
        check_config(cfg)
    except ConfigError as exc:
        print(f"tiny_gpt: {exc}", file=sys.stderr)
        return 2
    init_distributed(cfg)
    local = Checkpointer(args.checkpoint) if args.checkpoint else None
    result = train(cfg, local, resume=args.resume)
    if local is not None:
        local.close()
    print(json.dumps({"step": result["step"], "loss": result["loss"]}))
    return 0


def _deployed(args: argparse.Namespace, cfg: dict[str, Any]) -> int:
    """A run deployed by glue: the run's config, checkpointer, reports and outputs from its RunContext."""
    from glue.train.run.context import RunContext

    with RunContext.from_env() as ctx:
        own = {**ctx.config, **json.loads(args.config)}
        cfg.update(own)
        if "checkpoint_interval" not in own:  # the run's checkpoint.interval_steps, unless the config says
            cfg["checkpoint_interval"] = ctx.checkpoint_interval
        check_config(cfg)  # raised inside the run: recorded as the trainer's own error (user_error)
        distributed = init_distributed(cfg)
        ckpt = ctx.checkpointer()
        heldout = heldout_ids(cfg, load_eval_set())  # a missing or changed pinned set fails here, not at the end
        result = train(cfg, ckpt, resume=ctx.resume or args.resume, report=ctx, heldout=heldout)
        ckpt.close()
        fsdp = cfg["parallel"] == "fsdp"
        final_eval = evaluate(result["model"], heldout, cfg, result["device"]) if fsdp or ctx.rank == 0 else None
        weights = full_state(result["model"]) if fsdp else result["model"].state_dict()
        if distributed or fsdp:
            dist.barrier()  # rank 0 exports only after every rank finished its last step
            dist.destroy_process_group()
        if ctx.rank == 0 and final_eval is not None:  # recorded before the outputs that mark the run completed
            record_evaluation(ctx, result["step"], final_eval, final=True)
        if not cfg["skip_outputs"] and ctx.rank == 0:
            import io

            buf = io.BytesIO()
            torch.save(weights, buf)
            ctx.write_output("model.pt", buf.getvalue())
            ctx.write_output("final.json", json.dumps({"step": result["step"], "loss": result["loss"]}).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

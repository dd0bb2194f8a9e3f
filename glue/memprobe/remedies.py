"""The remedies memprobe compares, each applied ALONE to the failing input and held to the same
acceptance check: the loss after K steps within a tolerance of the reference run's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glue.runs.acceptance import MetricCheck

NAMES = ("checkpointing", "grad_accum", "bf16", "adapter")
DESCRIPTIONS = {
    "checkpointing": "activation checkpointing (recompute each block in backward)",
    "grad_accum": "gradient accumulation (smaller micro-batch, same effective batch)",
    "bf16": "bf16 autocast",
    "adapter": "train only a small adapter (the output head); the rest frozen",
}


@dataclass(frozen=True)
class Remedy:
    name: str
    description: str
    change: dict[str, Any]     # the trainer-config keys this remedy sets
    skipped: str | None = None  # why it does not apply to this config


def accumulation_split(batch: int, wanted: int) -> int | None:
    """Micro-batches per step: the largest divisor of the batch in [2, wanted], else its smallest
    divisor above that; None for a batch of 1 (nothing to split)."""
    if batch < 2:
        return None
    for a in range(min(wanted, batch), 1, -1):
        if batch % a == 0:
            return a
    return next(a for a in range(wanted + 1, batch + 1) if batch % a == 0)


def remedies(cfg: dict[str, Any], accum: int = 4, names: tuple[str, ...] = NAMES) -> list[Remedy]:
    """The remedies for a trainer config (tiny_gpt keys), each changing one thing."""
    out: list[Remedy] = []
    for name in names:
        desc = DESCRIPTIONS[name]
        if name == "checkpointing":
            out.append(Remedy(name, desc, {"checkpointing": True},
                              "already on in the config" if cfg.get("checkpointing") else None))
        elif name == "bf16":
            out.append(Remedy(name, desc, {"autocast_bf16": True},
                              "already on in the config" if cfg.get("autocast_bf16") else None))
        elif name == "adapter":
            out.append(Remedy(name, desc, {"adapter_only": True},
                              "already on in the config" if cfg.get("adapter_only") else None))
        elif name == "grad_accum":
            batch, have = int(cfg["batch_size"]), max(1, int(cfg.get("grad_accum") or 1))
            split = accumulation_split(batch, accum)
            if split is None:
                out.append(Remedy(name, desc, {}, "batch_size is 1: no smaller micro-batch"))
            else:
                out.append(Remedy(name, f"{desc}: {split} micro-batches of {batch // split}",
                                  {"batch_size": batch // split, "grad_accum": have * split}))
        else:
            raise ValueError(f"unknown remedy {name!r}")
    return out


def accepted(loss: float | None, reference: float | None, tolerance: float) -> bool | None:
    """|loss - reference| <= tolerance * |reference|; None when there is nothing to compare."""
    if loss is None or reference is None:
        return None
    return abs(loss - reference) <= tolerance * abs(reference)


def criteria_text(thresholds: dict[str, dict[str, float | None]]) -> str:
    """`val_loss ≤ 4.5, accuracy ≥ 0.8`: the run's acceptance criteria (run.yaml evaluation.metrics)."""
    return ", ".join(f"{name} {MetricCheck(name, None, b.get('min'), b.get('max')).bounds()}"
                     for name, b in sorted(thresholds.items()))


def judge(row: dict[str, Any], reference: float | None, tolerance: float,
          thresholds: dict[str, dict[str, float | None]]) -> None:
    """A remedy trial's verdict into `row`: by the run's acceptance criteria when the run has them and the trial
    recorded an evaluation, else by the loss check (within `tolerance` of the reference loss; with no reference,
    the loss must at least fall). `judged_by` says which."""
    if row.get("status") != "fit":
        row["accepted"] = False
        return
    if reference is not None and row.get("loss_last") is not None:
        row["loss_delta"] = row["loss_last"] - reference
    evaluation = row.get("evaluation") or {}
    if thresholds and evaluation.get("metrics") is not None:
        values = evaluation["metrics"]
        checks = [MetricCheck(name, None if values.get(name) is None else float(values[name]), b.get("min"),
                              b.get("max")) for name, b in sorted(thresholds.items())]
        row["acceptance"] = [{"metric": c.name, "value": c.value, "needs": c.bounds(), "passed": c.passed}
                             for c in checks]
        row["accepted"] = all(c.passed for c in checks)
        row["judged_by"] = f"the run's acceptance criteria, on its evaluation at step {evaluation.get('step')}"
        return
    ok = accepted(row.get("loss_last"), reference, tolerance)
    if ok is None:  # nothing to compare with: at least it must train
        ok = row.get("loss_last") is not None and row["loss_last"] < (row.get("loss_first") or float("inf"))
    row["accepted"] = ok
    row["judged_by"] = "the loss check" + (" (the trial recorded no evaluation for the run's acceptance criteria)"
                                           if thresholds else "")


def implied(cfg: dict[str, Any], accum: int = 4) -> dict[str, dict[str, Any]]:
    """Remedies a framework job takes without declaring them, by its framework's own argument names in its
    `config:`, computed at `cfg` (the failing input): a Hugging Face Trainer job (TrainingArguments, with
    per_device_train_batch_size) gets gradient_checkpointing, bf16 and gradient_accumulation_steps; a Lightning
    job (accumulate_grad_batches / precision beside batch_size) gets accumulate_grad_batches and bf16-mixed."""
    out: dict[str, dict[str, Any]] = {}
    if "per_device_train_batch_size" in cfg:
        out["gradient_checkpointing"] = {"gradient_checkpointing": True}
        out["bf16"] = {"bf16": True}
        out.update(_accumulate(cfg, "per_device_train_batch_size", "gradient_accumulation_steps", accum))
    if "accumulate_grad_batches" in cfg and "batch_size" in cfg:
        out.update(_accumulate(cfg, "batch_size", "accumulate_grad_batches", accum))
    if "precision" in cfg:
        out["bf16"] = {"precision": "bf16-mixed"}
    return out


def _accumulate(cfg: dict[str, Any], batch_key: str, steps_key: str, accum: int) -> dict[str, dict[str, Any]]:
    batch, have = int(cfg[batch_key]), max(1, int(cfg.get(steps_key) or 1))
    split = accumulation_split(batch, accum)
    return {} if split is None else {"grad_accum": {batch_key: batch // split, steps_key: have * split}}


def declared(names_changes: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> list[Remedy]:
    """A run's own remedies (run.yaml `memprobe: {remedies: {NAME: {KEY: VALUE}}}`), each its config changes."""
    out: list[Remedy] = []
    for name, change in names_changes.items():
        same = all(cfg.get(k) == v for k, v in change.items())
        desc = "the run's declared remedy: " + ", ".join(f"{k}={v}" for k, v in change.items())
        out.append(Remedy(name, desc, dict(change), "already so in the config" if same else None))
    return out

"""Evaluation results of a deployed run: the trainer records them, `glue status`/`report`/`compare` judge them.

    from glue.train.run.evaluation import load_eval_set, record_evaluation
    data = load_eval_set()                        # the pinned evaluation set's bytes (None: none configured)
    record_evaluation(ctx, step, {"val_loss": 1.23})

`glue deploy` checks the evaluation set's sha256 against the pin in run.yaml and hands its location to
the trainer (GPUKIT_EVAL_URI, GPUKIT_EVAL_SHA256); load_eval_set() checks the bytes it reads against
that pin again, so a set replaced after deploy is refused, not silently evaluated on. Records go to
runs/<run>/evaluation/<attempt>-<step>.json (rank 0 only: one result per step). Light: no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Protocol

from glue.train import trainer_vars as V
from glue.train.errors import StorageError
from glue.train.layout import evaluation_key
from glue.train.utc import iso, utc_now


class _Store(Protocol):
    def put(self, key: str, data: bytes | bytearray) -> None: ...


class _Run(Protocol):
    """What record_evaluation needs of glue.train.run.context.RunContext."""

    @property
    def attempt(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def store(self) -> _Store: ...


class EvalSetError(RuntimeError):
    """The evaluation set is missing or is not the pinned one."""


def record_evaluation(ctx: _Run, step: int, metrics: dict[str, float], *, final: bool = False) -> dict[str, Any]:
    """Write one evaluation result (metric name -> number) for `step`. Rank 0 records; other ranks no-op."""
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"evaluation metric {name!r} is {number} at step {step}: not a finite number")
        clean[str(name)] = number
    record = {"step": int(step), "attempt": ctx.attempt, "metrics": clean, "final": final, "at": iso(utc_now()),
              "dataset": {"uri": os.environ.get(V.EVAL_URI), "sha256": os.environ.get(V.EVAL_SHA256)}}
    if ctx.rank == 0:
        ctx.store.put(evaluation_key(ctx.attempt, step), json.dumps(record, indent=2).encode())
    return record


def load_eval_set(env: dict[str, str] | None = None) -> bytes | None:
    """The run's pinned evaluation set, read from the bucket and checked against its sha256; None when the
    run config has no `evaluation.dataset`."""
    env = dict(os.environ) if env is None else env
    uri, pin = env.get(V.EVAL_URI), env.get(V.EVAL_SHA256)
    if not uri:
        return None
    from glue.train.storage.credentials import credentials_from_file
    from glue.train.storage.target import open_target

    parent, _, name = uri.rpartition("/")
    cred_file = env.get(V.CREDENTIALS_FILE)
    kw: dict[str, Any] = {"check": False}
    if parent.startswith("s3://"):
        kw.update(endpoint_url=env.get(V.BUCKET_ENDPOINT) or None, region=env.get(V.BUCKET_REGION),
                  credentials=(lambda: credentials_from_file(cred_file)) if cred_file else None)
    try:
        data, _ = open_target(parent, **kw).get(name)
    except StorageError as exc:
        raise EvalSetError(f"evaluation set {uri} could not be read: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if pin and digest != pin:
        raise EvalSetError(f"evaluation set {uri} has sha256 {digest}, not the pinned {pin}: it changed after deploy")
    return bytes(data)

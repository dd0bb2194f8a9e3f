"""A tiny, fully deterministic training loop shared by the checkpoint tests (and its own sanity test).

It draws from every RNG the Checkpointer saves (python `random`, NumPy, torch CPU via dropout) and
reads data through a ResumableSampler with a partial last batch, so any state that is not restored
exactly shows up as a different loss.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from glue.train import Checkpointer, ResumableSampler, RNGState, TrainState, layout


@dataclass
class S3Conn:
    """How a child process reaches the local bucket (passed by pickling, never on a command line)."""

    endpoint: str
    access_key: str
    secret_key: str

    def credentials(self) -> Callable[[], Any]:
        return _StaticCreds(self.access_key, self.secret_key)

    def kwargs(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "credentials": self.credentials()}


@dataclass
class _Creds:
    access_key: str
    secret_key: str
    session_token: str | None = None
    expires_at: float | None = None


@dataclass
class _StaticCreds:
    access_key: str
    secret_key: str

    def __call__(self) -> _Creds:
        return _Creds(self.access_key, self.secret_key)


@dataclass
class Toy:
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    sampler: ResumableSampler
    loader: DataLoader[Any]
    train: TrainState
    rng: RNGState = field(default_factory=RNGState)
    _it: Iterator[Any] | None = None

    def batches(self) -> Iterator[Any]:
        while True:
            yield from self.loader  # the sampler moves to the next epoch by itself


def make_toy(seed: int = 0, n: int = 44, batch: int = 8, rank: int = 0, world_size: int = 1, width: int = 16) -> Toy:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    data = TensorDataset(x, y)
    sampler = ResumableSampler(data, seed=seed + 7, rank=rank, world_size=world_size)
    # generator=: creating a loader iterator must not draw from the global torch RNG (see sampler docs).
    loader = DataLoader(data, batch_size=batch, sampler=sampler, generator=torch.Generator())
    model = torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(width, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    return Toy(model, opt, sched, sampler, loader, TrainState())


def register(ckpt: Checkpointer, toy: Toy) -> Checkpointer:
    ckpt.register("model", toy.model)
    ckpt.register("optimizer", toy.opt)
    ckpt.register("scheduler", toy.sched)
    ckpt.register("data", toy.sampler)
    ckpt.register("rng", toy.rng)
    ckpt.register("train", toy.train)
    return ckpt


def train_step(toy: Toy, step: int, model: torch.nn.Module | None = None) -> float:
    """One step; `model` may wrap toy.model (DistributedDataParallel)."""
    if toy._it is None:
        toy._it = toy.batches()
    xb, yb = next(toy._it)
    # Noise from numpy and python `random` so their streams matter too.
    xb = xb + torch.from_numpy(np.random.standard_normal(xb.shape).astype(np.float32)) * 0.01
    xb = xb * (1.0 + random.random() * 0.01)
    loss = F.mse_loss((model or toy.model)(xb), yb)
    toy.opt.zero_grad()
    loss.backward()
    toy.opt.step()
    toy.sched.step()
    toy.train.step = step
    toy.train.epoch = toy.sampler.epoch
    toy.train.tokens_seen += int(xb.shape[0])
    return float(loss.item())


def run(
    toy: Toy, start: int, end: int, after: Callable[[int], None] | None = None, model: torch.nn.Module | None = None
) -> list[float]:
    """Steps start+1 .. end; returns their losses."""
    losses = []
    for step in range(start + 1, end + 1):
        losses.append(train_step(toy, step, model))
        if after is not None:
            after(step)
    return losses


def fingerprint(toy: Toy) -> dict[str, torch.Tensor]:
    """Every tensor of model and optimizer state, flattened by name (for bitwise comparison)."""
    out = {f"model.{k}": v.detach().clone() for k, v in toy.model.state_dict().items()}
    for pid, st in toy.opt.state_dict()["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"opt.{pid}.{k}"] = v.clone()
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fresh_context() -> Any:
    """Processes that never held any training state, started fast: forked from a forkserver that has
    only imported torch, boto3 and glue.train (a spawn costs ~4 s of imports on a small VM)."""
    ctx = mp.get_context("forkserver")
    # torch.use_deterministic_algorithms imports torch._inductor (~2 s): pay that once, here.
    ctx.set_forkserver_preload([__name__, "torch._inductor"])
    return ctx


def in_fresh_process(fn: Callable[..., None], *args: Any, timeout: float = 120) -> None:
    p = fresh_context().Process(target=fn, args=args)
    p.start()
    p.join(timeout)
    if p.exitcode is None:
        p.kill()
        p.join()
    assert p.exitcode == 0, f"{fn.__name__} exited {p.exitcode}"


def json_result(fn: Callable[..., None], *args: Any, out: Path, timeout: float = 300) -> dict[str, Any]:
    """fn(*args, out) in a fresh process; the JSON it wrote to `out`, its "losses" keyed by int step."""
    in_fresh_process(fn, *args, str(out), timeout=timeout)
    result: dict[str, Any] = json.loads(out.read_text())
    result["losses"] = {int(k): v for k, v in result.get("losses", {}).items()}
    return result


def start_and_join(procs: list[Any], timeout: float) -> list[int | None]:
    """Start every process, wait for each (killing one still running after `timeout`); their exit codes."""
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_context_env(bucket: Any, run: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment glue gives a deployed trainer (RunContext.from_env) for `run` in the local bucket;
    the credentials in a 0600 file under tmp_path."""
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"access_key": bucket.creds.access_key, "secret_key": bucket.creds.secret_key}))
    creds.chmod(0o600)
    name = bucket.info.name
    return {**os.environ, "GPUKIT_RUN": run, "GPUKIT_ATTEMPT": "1", "GPUKIT_BUCKET_NAME": name,
            "GPUKIT_BUCKET_ENDPOINT": bucket.info.endpoint, "GPUKIT_CREDENTIALS_FILE": str(creds),
            "GPUKIT_CHECKPOINT": layout.run_uri(name, run),
            "GPUKIT_OUTPUTS": f"{layout.run_uri(name, run)}/{layout.OUTPUTS}",
            "PYTHONWARNINGS": "ignore", **extra}


@contextmanager
def parent_torch_settings() -> Iterator[None]:
    """make_toy() sets process-wide torch flags; undo them when a toy runs inside the test process."""
    det, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


@parent_torch_settings()
def test_toy_is_deterministic() -> None:
    a = make_toy()
    la = run(a, 0, 9)
    b = make_toy()
    lb = run(b, 0, 9)
    assert la == lb
    assert same(fingerprint(a), fingerprint(b))
    assert a.sampler.epoch == 1 and a.sampler.index == 3 * 8  # 6 batches/epoch, 9 steps in

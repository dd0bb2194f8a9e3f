"""kill -9 of a 2-rank FSDP2 run inside every window of a sharded save, and (stress) at random times.

Both ranks of tiny_gpt (`parallel: fsdp`) restore, train and save every K steps to a folder; the parent
kills them, then restores the newest valid checkpoint into a plain (unsharded) model in-process, which
also exercises the resharding path: the state must be exactly the reference run's at that step, never a
torn or mixed one. Each next pair resumes from the same target, so every earlier kill's leftovers are
part of what is tested. In the window test rank 0 holds its save at a named point of the commit
protocol (glue.train.checkpoint.hold_point) and the kill lands there; timing decides nothing.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from glue.examples import tiny_gpt
from glue.train import Checkpointer, TrainState, layout
from glue.train.checkpoint import hold_point
from glue.train.checkpoint.format import list_steps
from glue.train.storage.folder import FileStorage
from tests.integration.test_ckpt_toy import free_port, fresh_context

K = 2
CFG: dict[str, Any] = {"steps": 200, "checkpoint_interval": K, "parallel": "fsdp", "corpus_chars": 5000, "seq_len": 16,
       "d_model": 32, "n_layer": 2, "n_head": 4, "batch_size": 8}


class _Enough(Exception):
    """The reference run has recorded as many steps as the test needs (raised on every rank alike)."""


class _Recording(Checkpointer):
    """Rank 0 notes each restore and save in a progress file; the reference run also keeps the full
    model state of every saved step; a held run holds rank 0's save after the one it restored."""

    def __init__(self, target: str, progress: str, hold: tuple[str, str] | None, states: dict[int, Any] | None,
                 until: int = 0) -> None:
        super().__init__(target, keep_last=2 if states is None else 1000, handle_sigterm=False)
        self.progress, self.hold, self.states, self.until = progress, hold, states, until

    def _note(self, line: str) -> None:
        if self.rank == 0:
            with open(self.progress, "a") as f:
                f.write(line + "\n")

    def restore(self, step: int | None = None, *, start_fresh: bool = False) -> int | None:
        got = super().restore(step, start_fresh=start_fresh)
        self._note(f"restored {got or 0}")
        if self.hold is not None and self.rank == 0:
            point, marker = self.hold
            hold_point.arm(point, (got or 0) + (3 if point == "prune" else 2) * K, marker)
        return got

    def save(self, step: int, *, blocking: bool = False) -> None:
        if self.states is not None:
            full = tiny_gpt.full_state(self._components["model"].obj)  # type: ignore[arg-type]
            if self.rank == 0:
                self.states[step] = full
        super().save(step, blocking=blocking)
        self._note(f"saved {step}")
        if self.states is not None and step >= self.until:
            raise _Enough


def _rank(rank: int, port: int, target: str, progress: str, hold: tuple[str, str] | None, reference: str | None,
          step_sleep: float, until: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    states: dict[int, Any] | None = {} if reference else None
    ck = _Recording(target, progress, hold, states, until)
    try:
        tiny_gpt.train(dict(tiny_gpt.DEFAULTS, **{**CFG, "step_sleep": step_sleep}), ck, resume=True)
    except _Enough:
        pass
    ck.close()
    if reference and rank == 0:
        torch.save(states, reference)
    os._exit(0)  # not torn down: see test_ckpt_ddp


def _pair(target: str, progress: Path, *, hold: tuple[str, str] | None = None, reference: Path | None = None,
          step_sleep: float = 0.0, until: int = 0) -> list[Any]:
    ctx = fresh_context()
    port = free_port()
    ref = str(reference) if reference else None
    procs = [ctx.Process(target=_rank, args=(r, port, target, str(progress), hold, ref, step_sleep, until))
             for r in range(2)]
    for p in procs:
        p.start()
    return procs


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _kill(procs: list[Any]) -> None:
    for p in procs:
        if p.pid is not None and p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(30)


def _reference(tmp: Path, until: int) -> dict[int, dict[str, torch.Tensor]]:
    """The full model state after every K-th step up to `until` of an uninterrupted 2-rank run (same config)."""
    out = tmp / "states.pt"
    procs = _pair(str(tmp / "ckpt"), tmp / "progress", reference=out, until=until)
    for p in procs:
        p.join(400)
    assert [p.exitcode for p in procs] == [0, 0]
    states: dict[int, dict[str, torch.Tensor]] = torch.load(out, weights_only=True)
    return states


def _restored(target: str) -> tuple[int | None, dict[str, torch.Tensor]]:
    """The newest valid checkpoint, restored in this process into an unsharded model."""
    model, _, _ = tiny_gpt.build(dict(tiny_gpt.DEFAULTS, **CFG))
    ck = Checkpointer(target, handle_sigterm=False)
    ck.register("model", model)
    train = ck.register("train", TrainState())
    got = ck.restore()
    ck.close()
    assert got is None or train.step == got
    return got, model.state_dict()


def _check(got: int | None, state: dict[str, torch.Tensor], reference: dict[int, Any], what: str) -> None:
    assert got is not None and got % K == 0, f"{what}: restored {got}"
    assert all(torch.equal(state[k], reference[got][k]) for k in state), f"{what}: step {got} is not the reference's"


@pytest.mark.timeout(600)
def test_kill9_in_every_window_of_a_sharded_save(tmp_path: Path) -> None:
    # Each window's pair saves at most 3 intervals past what it restored.
    reference_states = _reference(tmp_path, until=len(hold_point.POINTS) * 3 * K)
    target = str(tmp_path / "run")
    for i, point in enumerate(hold_point.POINTS):
        progress, marker = tmp_path / f"progress-{i}", tmp_path / f"held-{i}"
        procs = _pair(target, progress, hold=(point, str(marker)))
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert all(p.is_alive() for p in procs) and time.monotonic() < deadline, (
                f"kill {i}: rank 0 never held at {point!r}; progress: {_text(progress)}")
            time.sleep(0.01)
        _kill(procs)
        restored_by_pair = int(progress.read_text().split()[1])
        held = restored_by_pair + (3 if point == "prune" else 2) * K
        present = list_steps(FileStorage(Path(target)))
        got, state = _restored(target)
        if point in ("upload", "verify", "commit"):
            assert present.get(held) and layout.COMMIT not in present[held], (i, point, present)
            assert got == held - K, f"kill {i} at {point}: restored {got}, not the last committed {held - K}"
        else:
            assert layout.COMMIT in present[held] and got == held, f"kill {i} at {point}: restored {got}"
        _check(got, state, reference_states, f"kill {i} at {point}")


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_kill9_at_random_points_of_sharded_saves(tmp_path: Path) -> None:
    """20 kills at random times after the pair restored: every restore finds the exact reference state."""
    reference_states = _reference(tmp_path, until=int(CFG["steps"]))
    rng = random.Random(7)
    target = str(tmp_path / "run")
    for i in range(20):
        progress = tmp_path / f"progress-{i}"
        procs = _pair(target, progress, step_sleep=0.05)  # ~8 steps per kill on average: 20 kills fit in 200
        deadline = time.monotonic() + 180
        while not (progress.exists() and progress.read_text().startswith("restored")):
            assert all(p.is_alive() for p in procs) and time.monotonic() < deadline, f"kill {i}: never restored"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.8))
        _kill(procs)
        got, state = _restored(target)
        if got is None:
            continue  # killed before its first commit
        _check(got, state, reference_states, f"kill {i}")

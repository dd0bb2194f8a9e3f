"""Bitwise resume with DataLoader worker processes: data position and worker randomness.

Each case runs the README's loop (tests/integration/ckpt_workers_loop.py: AdamW, a scheduler,
dropout, a Dataset augmenting with torch, NumPy and Python randomness) as real processes: a
reference without interruption, and a run that commits step K and dies, resumed by a NEW process.
The resumed steps' losses and the final model must be bitwise those of the reference.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glue.train import layout

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24  # 10 steps per epoch: resumed runs cross two epoch boundaries


def loop(out: Path, target: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.integration.ckpt_workers_loop", str(out), str(target), *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def trained(out: Path, target: Path, *args: str) -> dict[str, Any]:
    proc = loop(out, target, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(out.read_text()))


_REFS: dict[tuple[str, ...], dict[str, Any]] = {}


def reference(tmp_path_factory: pytest.TempPathFactory, *args: str) -> dict[str, Any]:
    if args not in _REFS:
        d = tmp_path_factory.mktemp("ref")
        _REFS[args] = trained(d / "out.json", d / "ckpt", "--steps", str(STEPS), *args)
    return _REFS[args]


def assert_resumed_bitwise(ref: dict[str, Any], got: dict[str, Any], stop: int) -> None:
    diff = [s for s, v in got["losses"].items() if ref["losses"][s] != v]
    assert sorted(map(int, got["losses"])) == list(range(stop + 1, STEPS + 1))
    assert not diff, f"losses differ after resuming at step {stop}: steps {diff[:5]}"
    assert got["model"] == ref["model"], "the model differs after resume"


def loader_args(kind: str, workers: int, persistent: bool) -> list[str]:
    return ["--loader", kind, "--workers", str(workers)] + (["--persistent"] if persistent else [])


def ref_args(kind: str, workers: int, persistent: bool) -> tuple[str, ...]:
    if kind == "kit":
        # Per-sample seeding: every worker count (> 0), persistent or not, draws the same numbers.
        return tuple(loader_args(kind, 2 if workers else 0, False))
    return tuple(loader_args(kind, workers, persistent))  # a worker's streams depend on both


# make test: the kit's loader; StatefulDataLoader's cases in make test-all (since 2026-12-07: the suite's time).
FAST = {("kit", 2, True, 6)}
CASES = [
    pytest.param(kind, w, p, stop, marks=() if (kind, w, p, stop) in FAST else pytest.mark.stress,
                 id=f"{kind}-w{w}{'-persistent' if p else ''}-stop{stop}")
    for kind in ("kit", "sdl")
    for w in (0, 2, 4)
    for p in ((False, True) if w else (False,))
    for stop in (6, 10)  # mid-epoch, and the last batch of an epoch
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kind", "workers", "persistent", "stop"), CASES)
def test_resume_with_workers_is_bitwise(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, kind: str, workers: int, persistent: bool, stop: int
) -> None:
    ref = reference(tmp_path_factory, *ref_args(kind, workers, persistent))
    args = loader_args(kind, workers, persistent)
    killed = loop(tmp_path / "x.json", tmp_path / "ckpt", *args, "--steps", str(STEPS), "--stop", str(stop))
    assert killed.returncode == 0, killed.stderr[-2000:]
    got = trained(tmp_path / "out.json", tmp_path / "ckpt", *args, "--steps", str(STEPS))
    assert_resumed_bitwise(ref, got, stop)


@pytest.mark.stress
@pytest.mark.timeout(300)
def test_sdl_without_worker_rng_diverges(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Why WorkerRNG exists: the same loop with the bare Dataset does not resume exactly."""
    args = ["--loader", "sdl", "--workers", "2", "--steps", str(STEPS), "--bare-dataset"]
    ref = trained(tmp_path / "ref.json", tmp_path / "ref", *args)
    assert loop(tmp_path / "x.json", tmp_path / "ckpt", *args, "--stop", "6").returncode == 0
    got = trained(tmp_path / "out.json", tmp_path / "ckpt", *args)
    assert got["model"] != ref["model"]


def test_plain_dataloader_with_workers_refuses_in_one_line(tmp_path: Path) -> None:
    proc = loop(tmp_path / "x.json", tmp_path / "ckpt", "--loader", "plain", "--workers", "2", "--steps", "3")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "ValueError: ResumableSampler in a DataLoader with worker processes" in last
    assert "glue.train.ResumableLoader" in last


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("kind", ["kit", "sdl"])
def test_kill9_storm_with_workers(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, kind: str) -> None:
    """SIGKILL at random moments (mid-step, mid-save); every restart resumes from the newest valid
    checkpoint; the finished run's model equals the uninterrupted one."""
    args = [*loader_args(kind, 2, False), "--steps", str(STEPS), "--save-every", "3", "--step-sleep", "0.1"]
    ref = trained(tmp_path / "ref.json", tmp_path / "ref", *args)
    rnd = random.Random(19)
    out, target = tmp_path / "out.json", tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "tests.integration.ckpt_workers_loop", str(out), str(target), *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    killed_after: set[int] = set()  # the newest committed step at each kill
    for _ in range(12):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, start_new_session=True)
        assert proc.stdout is not None
        steps = rnd.randint(1, 5)  # then somewhere inside a step or a save
        while steps and (line := proc.stdout.readline()):
            steps -= line.startswith("step ")
        time.sleep(rnd.uniform(0.0, 0.4))
        if proc.poll() is not None:
            assert proc.returncode == 0
            break
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its workers, like a lost VM
        proc.wait()
        commits = target.glob(f"{layout.CKPT_PREFIX}step-*/{layout.COMMIT}")
        killed_after.add(max((int(p.parent.name[5:]) for p in commits), default=0))
    assert len(killed_after) >= 3, f"the kills did not land across the run: {killed_after}"
    got = trained(out, target, *args)
    assert got["model"] == ref["model"]
    assert all(ref["losses"][s] == v for s, v in got["losses"].items())

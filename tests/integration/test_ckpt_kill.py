"""kill -9 of the saving process inside every window of save and prune.

A child trains the toy model, restoring first, and saves every K steps; the parent kills it, then
restores in-process and checks: a valid checkpoint is found, its content is exactly the reference
state for that step (never a corrupt or mixed one), and it is at most one interval behind the last
save() that returned. The next child resumes from the same target, so leftovers of every earlier
kill are part of what is being tested.

Where the kill lands is not left to timing: the child holds a save (see _held_step) at a named point of the
commit protocol (glue.train.checkpoint.hold_point: upload, verify, commit, committed, prune) and the
parent kills it once it is held there, so every run covers every window. The stress tests add kills
at random times on top.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from glue.train import Checkpointer, layout, open_target
from glue.train.checkpoint import hold_point
from glue.train.checkpoint.format import list_steps
from tests.integration.test_ckpt_toy import (
    S3Conn,
    Toy,
    fingerprint,
    fresh_context,
    make_toy,
    parent_torch_settings,
    register,
    same,
    train_step,
)

K = 4  # save interval, in steps


def _held_step(point: str, restored: int) -> int:
    """The save a child that restored `restored` holds at `point`: its second save, whose prune finds
    a committed step to delete only from the third on (keep_last=2 and the restored step are kept)."""
    return restored + (3 if point == "prune" else 2) * K


def _child(target: str, conn: S3Conn | None, progress: str, hold: tuple[str, str] | None = None) -> None:
    toy = make_toy(seed=0)
    ck = register(Checkpointer(target, keep_last=2, handle_sigterm=False, **(conn.kwargs() if conn else {})), toy)
    fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, f"{line}\n".encode())

    step = ck.restore() or 0
    if hold is not None:
        point, marker = hold
        hold_point.arm(point, _held_step(point, step), marker)
    note(f"restored {step}")
    committed = ck.last_committed_step
    while True:
        step += 1
        train_step(toy, step)
        if step % K == 0:
            ck.save(step)
            note(f"saved {step}")  # save() returned: the previous save is committed and pruned
        if ck.last_committed_step != committed:
            committed = ck.last_committed_step
            note(f"committed {committed}")


class Reference:
    """The uninterrupted run's state at every multiple of K, computed on demand."""

    def __init__(self) -> None:
        self.toy: Toy = make_toy(seed=0)
        self.rng = self.toy.rng.state_dict()  # the global RNGs are shared with the restores in between
        self.step = 0
        self.fps: dict[int, Any] = {0: None}

    def at(self, step: int) -> Any:
        self.toy.rng.load_state_dict(self.rng)
        while self.step < step:
            self.step += 1
            train_step(self.toy, self.step)
            if self.step % K == 0:
                self.fps[self.step] = fingerprint(self.toy)
        self.rng = self.toy.rng.state_dict()
        return self.fps[step]


def _progress(path: Path) -> tuple[int, int]:
    """(last step whose save() returned, last step reported committed)."""
    saved = committed = 0
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                if parts[0] == "saved":
                    saved = int(parts[1])
                elif parts[0] == "committed":
                    committed = int(parts[1])
    return saved, committed


def _kill_loop(target: str, conn: S3Conn | None, tmp_path: Path, iterations: int, seed: int) -> None:
    ctx = fresh_context()
    rng = random.Random(seed)
    kwargs = conn.kwargs() if conn else {}
    partial_seen = in_prune = 0
    best = 0  # newest step ever reported committed
    storage = open_target(target, **kwargs)  # one client for all the parent's restores
    with parent_torch_settings():
        ref = Reference()
        for i in range(iterations):
            progress = tmp_path / f"progress-{i}.log"
            p = ctx.Process(target=_child, args=(target, conn, str(progress)))
            p.start()
            # Kill at a random point of the save loop, however long start-up and restore took.
            deadline = time.monotonic() + 60
            while not (progress.exists() and progress.read_text().startswith("restored")):
                assert p.is_alive() and time.monotonic() < deadline, f"iteration {i}: child did not start"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.6))
            assert p.pid is not None
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            assert p.exitcode == -signal.SIGKILL, f"iteration {i}: child exited {p.exitcode} (crashed?)"
            saved, committed = _progress(progress)
            best = max(best, committed)

            ck = Checkpointer(target, keep_last=2, handle_sigterm=False, storage=storage)
            steps_present = list_steps(ck.storage)
            toy = make_toy(seed=999)
            register(ck, toy)
            got = ck.restore()
            ck.close()
            if any(got is None or s > got for s in steps_present):
                partial_seen += 1  # a newer, incomplete step directory was skipped
            committed_dirs = [s for s, objs in steps_present.items() if layout.COMMIT in objs]
            uncommitted = set(steps_present) - set(committed_dirs)
            if len(committed_dirs) > 2 or any(got is not None and s < got for s in uncommitted):
                in_prune += 1  # killed between a commit and the end of its prune
            if got is None:
                assert best == 0 and saved <= K, f"iteration {i}: nothing restored after {saved=} {best=}"
                continue
            assert got >= best, f"iteration {i}: restored {got}, but {best} had been committed"
            assert got >= saved - K, f"iteration {i}: restored {got}, more than one interval behind {saved}"
            assert got % K == 0
            assert same(fingerprint(toy), ref.at(got)), f"iteration {i}: step {got} does not match the reference"
            assert toy.train.step == got
    # Where random kills land depends on the machine; the windows are covered by _kill_in_windows.
    print(f"{iterations} kills: {partial_seen} inside a save, {in_prune} inside a prune")


# Every window twice: the second round finds the first round's leftovers (a partial step, a half-pruned one).
WINDOWS = [*hold_point.POINTS, *hold_point.POINTS]


def _kill_in_windows(target: str, conn: S3Conn | None, tmp_path: Path) -> None:
    ctx = fresh_context()
    kwargs = conn.kwargs() if conn else {}
    best = 0
    storage = open_target(target, **kwargs)
    with parent_torch_settings():
        ref = Reference()
        for i, point in enumerate(WINDOWS):
            progress, marker = tmp_path / f"progress-{i}.log", tmp_path / f"held-{i}"
            p = ctx.Process(target=_child, args=(target, conn, str(progress), (point, str(marker))))
            p.start()
            deadline = time.monotonic() + 120
            while not marker.exists():
                assert p.is_alive() and time.monotonic() < deadline, (
                    f"kill {i}: the child never held at {point!r}; its progress: {progress.read_text()!r}")
                time.sleep(0.01)
            assert p.pid is not None
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            assert p.exitcode == -signal.SIGKILL, f"kill {i}: child exited {p.exitcode} (crashed?)"
            restored_by_child = int(progress.read_text().split()[1])
            held = _held_step(point, restored_by_child)
            saved, committed = _progress(progress)
            best = max(best, committed)

            steps_present = list_steps(storage)
            ck = Checkpointer(target, keep_last=2, handle_sigterm=False, storage=storage)
            toy = make_toy(seed=999)
            register(ck, toy)
            got = ck.restore()
            ck.close()
            # What the window leaves behind, and what restore makes of it.
            if point in ("upload", "verify", "commit"):
                assert layout.COMMIT not in steps_present.get(held, {}) and steps_present.get(held), (i, point)
                assert got == held - K, f"kill {i} at {point}: restored {got}, not the last committed {held - K}"
            else:
                assert layout.COMMIT in steps_present[held] and got == held, f"kill {i} at {point}: restored {got}"
            if point == "prune":
                half = [s for s, objs in steps_present.items() if s < held and layout.COMMIT not in objs and objs]
                assert half, f"kill {i} at prune: no step left half-pruned ({steps_present})"
            assert got is not None and got >= best and got >= saved - K and got % K == 0, (i, got, best, saved)
            assert same(fingerprint(toy), ref.at(got)), f"kill {i}: step {got} does not match the reference"
            assert toy.train.step == got


@pytest.mark.timeout(600)
def test_kill9_in_every_window_of_save_and_prune_s3(local_bucket: Any, tmp_path: Path) -> None:
    conn = S3Conn(local_bucket.info.endpoint, local_bucket.creds.access_key, local_bucket.creds.secret_key)
    target = layout.run_uri(local_bucket.info.name, f"kill-{uuid.uuid4().hex[:8]}")
    _kill_in_windows(target, conn, tmp_path)


# `stress` (make test-all, since 2026-12-07): the same windows as the test above, on a directory target.
@pytest.mark.stress
@pytest.mark.timeout(600)
def test_kill9_in_every_window_of_save_and_prune_filesystem(tmp_path: Path) -> None:
    _kill_in_windows(str(tmp_path / "bucket" / "runs" / "kill"), None, tmp_path)


@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_kill9_stress_s3(local_bucket: Any, tmp_path: Path, seed: int) -> None:
    conn = S3Conn(local_bucket.info.endpoint, local_bucket.creds.access_key, local_bucket.creds.secret_key)
    target = layout.run_uri(local_bucket.info.name, f"kill-stress-{uuid.uuid4().hex[:8]}")
    _kill_loop(target, conn, tmp_path, iterations=200, seed=seed)


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_kill9_stress_filesystem(tmp_path: Path) -> None:
    _kill_loop(str(tmp_path / "bucket" / "runs" / "kill"), None, tmp_path, iterations=300, seed=21)

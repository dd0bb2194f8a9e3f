"""Checkpointer on a filesystem target: protocol details, async behaviour, ranks, signals, bad input."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.train import (
    Checkpointer,
    CheckpointError,
    ResumableSampler,
    RNGState,
    SaveFailedError,
    StateMismatchError,
    StorageError,
    TargetError,
    TrainState,
    layout,
    validate_checkpoints,
)
from glue.train.storage.folder import FileStorage
from glue.train.storage.retry import RetryPolicy, Transient, with_retry

ROOT = Path(__file__).resolve().parents[2]


class Slow(FileStorage):
    def __init__(self, root: Path, delay: float) -> None:
        super().__init__(root)
        self.delay = delay

    def put(self, key: str, data: bytes | bytearray) -> None:
        time.sleep(self.delay)
        super().put(key, data)


class Broken(FileStorage):
    def put(self, key: str, data: bytes | bytearray) -> None:
        if key.endswith(".pt"):
            raise StorageError(f"write {key} failed after 10 attempts over 300.0s: disk on fire")
        super().put(key, data)


def _ck(root: Path, **kw: Any) -> Checkpointer:
    kw.setdefault("handle_sigterm", False)
    return Checkpointer(str(root), **kw)


class Model:
    def __init__(self, width: int = 4) -> None:
        self.net = torch.nn.Linear(3, width)
        self.train = TrainState()
        self.rng = RNGState()

    def at(self, step: int) -> Model:
        with torch.no_grad():
            for p in self.net.parameters():
                p.fill_(float(step))
        self.train.step = step
        return self

    def register(self, ck: Checkpointer) -> Checkpointer:
        ck.register("model", self.net)
        ck.register("train", self.train)
        ck.register("rng", self.rng)
        return ck


def _steps(root: Path) -> list[int]:
    d = root / layout.CKPT_PREFIX
    return sorted(int(p.name[5:]) for p in d.iterdir()) if d.exists() else []


def test_save_restore_and_keep_last(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path, keep_last=3)) as ck:
        for s in (1, 2, 3, 4, 5):
            m.at(s)
            ck.save(s)
        ck.flush()
        assert ck.last_committed_step == 5
    assert _steps(tmp_path) == [3, 4, 5]
    fresh = Model()
    with fresh.register(_ck(tmp_path)) as ck2:
        assert ck2.latest_valid() == 5
        assert ck2.restore() == 5
        assert ck2.restore(step=3) == 3
    assert float(fresh.net.weight.detach()[0, 0]) == 3.0 and fresh.train.step == 3


def test_commit_is_last_and_lists_every_object(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        ck.save(7, blocking=True)
    step_dir = tmp_path / layout.step_prefix(7)
    files = {p.name: p for p in step_dir.iterdir()}
    commit = json.loads(files.pop(layout.COMMIT).read_text())
    assert {o["key"] for objs in commit["components"].values() for o in objs} == set(files)
    # Written last: nothing in the directory is newer than COMMIT.json.
    assert all(p.stat().st_mtime_ns <= (step_dir / layout.COMMIT).stat().st_mtime_ns for p in files.values())


def test_resaving_a_step_replaces_it_and_removes_leftovers(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        m.at(1)
        ck.save(1, blocking=True)
    # leftovers of an earlier, interrupted attempt at step 2
    (tmp_path / layout.step_prefix(2)).mkdir()
    (tmp_path / layout.step_prefix(2) / "junk.rank3.pt").write_bytes(b"old")
    with m.register(_ck(tmp_path)) as ck:
        m.at(2)
        ck.save(2, blocking=True)
        m.at(22)
        ck.save(2, blocking=True)  # same step again, different content: the new one wins
    assert not (tmp_path / layout.step_prefix(2) / "junk.rank3.pt").exists()
    fresh = Model()
    with fresh.register(_ck(tmp_path)) as ck:
        assert ck.restore() == 2
    assert float(fresh.net.weight.detach()[0, 0]) == 22.0


def test_restored_step_is_not_rewritten(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        ck.save(4, blocking=True)
    commit = tmp_path / layout.commit_key(4)
    before = commit.read_bytes()
    with Model().register(_ck(tmp_path)) as ck:
        assert ck.restore() == 4
        ck.save(4, blocking=True)  # already committed, identical: skipped (never made invalid)
        assert commit.read_bytes() == before
        ck.save(5, blocking=True)
        timings = json.loads((tmp_path / layout.commit_key(5)).read_text())["timings"]
    assert timings["restore"]["from_step"] == 4


def test_partial_newer_steps_are_skipped_recorded_and_later_pruned(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        for s in (1, 2):
            ck.save(s, blocking=True)
    partial = tmp_path / layout.step_prefix(9)
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    with Model().register(_ck(tmp_path)) as ck:
        assert ck.restore() == 2
        (incident,) = [json.loads(p.read_text()) for p in (tmp_path / "incidents").iterdir()]
        assert incident["step"] == 9 and "COMMIT.json is missing" in incident["what"]
        assert incident["class"] == "ckpt_interrupted"  # routine after a kill: not reported as corruption
        assert incident["object"] == layout.commit_key(9) and incident["fell_back_to"] == 2
        ck.save(3, blocking=True)
    assert _steps(tmp_path) == [2, 3], "the old timeline's partial step 9 is gone after the next save"


def test_truncated_object_on_filesystem_falls_back(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path, keep_last=3)) as ck:
        for s in (1, 2):
            m.at(s)
            ck.save(s, blocking=True)
    obj = tmp_path / layout.step_prefix(2) / "model.pt"
    truncated = obj.read_bytes()[:-10]
    obj.write_bytes(truncated)
    fresh = Model()
    with fresh.register(_ck(tmp_path)) as ck:
        assert ck.restore() == 1
    assert float(fresh.net.weight.detach()[0, 0]) == 1.0
    # The corrupt step is moved aside (kept for inspection, out of prune's way).
    assert [s.step for s in validate_checkpoints(str(tmp_path)) if s.valid] == [1]
    (moved,) = (tmp_path / "ckpt-invalid").glob("*/step-2/model.pt")
    assert moved.read_bytes() == truncated and not obj.exists()


def test_a_resumed_process_keeps_the_checkpoint_it_resumed_from(tmp_path: Path) -> None:
    """README: a resumed process never prunes the step it resumed from (keep_last besides it): should
    glue's resume check find the resume wrong, that checkpoint is still there to go back to."""
    m = Model()
    with m.register(_ck(tmp_path, keep_last=2)) as ck:
        for s in (1, 2, 3):
            m.at(s)
            ck.save(s, blocking=True)
    assert _steps(tmp_path) == [2, 3]
    resumed = Model()
    with resumed.register(_ck(tmp_path, keep_last=2)) as ck:
        assert ck.restore() == 3
        for s in (4, 5, 6):
            resumed.at(s)
            ck.save(s, blocking=True)
    assert _steps(tmp_path) == [3, 5, 6]  # 3: where it resumed; 5, 6: keep_last
    later = Model()
    with later.register(_ck(tmp_path, keep_last=2)) as ck:  # the next process resumes from 6: 3 may go
        assert ck.restore() == 6
        later.at(7)
        ck.save(7, blocking=True)
    assert _steps(tmp_path) == [6, 7]


def test_a_resumed_process_may_not_overwrite_its_history(tmp_path: Path) -> None:
    """A trainer that restored step 3 but counts from 1 again would rewrite the checkpoints it resumed
    from with another trajectory: refused, and the committed checkpoint stays as it was."""
    m = Model()
    with m.register(_ck(tmp_path, keep_last=3)) as ck:
        for s in (1, 2, 3):
            m.at(s)
            ck.save(s, blocking=True)
    before = (tmp_path / layout.commit_key(2)).read_bytes()
    resumed = Model()
    with resumed.register(_ck(tmp_path, keep_last=3)) as ck:
        assert ck.restore() == 3
        ck.save(3)  # the step it restored, first: already committed, skipped
        with pytest.raises(CheckpointError, match="refusing to overwrite committed checkpoint step 2: this process "
                                                  "resumed from step 3"):
            ck.save(2, blocking=True)
        resumed.at(4)
        ck.save(4, blocking=True)  # counting on is fine
    assert (tmp_path / layout.commit_key(2)).read_bytes() == before and _steps(tmp_path) == [2, 3, 4]


def test_only_rejected_checkpoints_left_start_fresh(tmp_path: Path) -> None:
    """A from-scratch resume judged wrong leaves only rejected checkpoints: the next restore starts fresh
    (they are moved aside), instead of refusing as it does for corrupt ones."""
    from glue.train.checkpoint.format import reject
    from glue.train.storage.target import open_target

    m = Model()
    with m.register(_ck(tmp_path, keep_last=3)) as ck:
        for s in (1, 2):
            m.at(s)
            ck.save(s, blocking=True)
    assert reject(open_target(str(tmp_path)), [1, 2], "bad_restart of attempt 2: loss differs", "test") == [1, 2]
    with Model().register(_ck(tmp_path)) as ck:
        assert ck.restore() is None
    assert _steps(tmp_path) == [] and len(list((tmp_path / "ckpt-invalid").glob("*/step-*"))) == 2


def test_a_rejected_checkpoint_is_never_resumed_and_kept_aside(tmp_path: Path) -> None:
    """README (bad_restart): the checkpoints a wrong resume wrote are marked rejected, so no later resume
    starts from them; their bytes are kept (moved aside by restore, like a corrupt one)."""
    from glue.train.checkpoint.format import REJECTED, reject
    from glue.train.storage.target import open_target

    m = Model()
    with m.register(_ck(tmp_path, keep_last=3)) as ck:
        for s in (1, 2, 3):
            m.at(s)
            ck.save(s, blocking=True)
    st = open_target(str(tmp_path))
    assert reject(st, [2, 3, 7], "bad_restart of attempt 2: loss differs", "test") == [2, 3]  # 7: no such step
    assert reject(st, [3], "again", "test") == []  # marked once
    statuses = {s.step: s for s in validate_checkpoints(str(tmp_path))}
    assert [s for s, v in statuses.items() if v.valid] == [1]
    assert statuses[3].problems[0].what == "rejected: bad_restart of attempt 2: loss differs"
    fresh = Model()
    with fresh.register(_ck(tmp_path)) as ck:
        assert ck.restore() == 1
    assert float(fresh.net.weight.detach()[0, 0]) == 1.0
    moved = sorted(p.parent.name for p in (tmp_path / "ckpt-invalid").glob(f"*/step-*/{REJECTED}"))
    assert moved == ["step-2", "step-3"] and not (tmp_path / layout.step_prefix(3)).exists()
    kinds = sorted(json.loads(p.read_text())["class"] for p in (tmp_path / "incidents").glob("*.json"))
    assert kinds == ["ckpt_rejected", "ckpt_rejected"]


def test_save_returns_after_snapshot_and_back_pressure_waits(tmp_path: Path) -> None:
    m = Model()
    st = Slow(tmp_path, delay=0.2)
    with m.register(_ck(tmp_path, storage=st)) as ck:
        t0 = time.monotonic()
        ck.save(1)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        ck.save(2)  # waits for save 1 (at most one in flight)
        second = time.monotonic() - t0
        ck.flush()
        assert ck.last_save_timings["wait_s"] >= 0.4
    assert first < 0.15, first
    assert second >= 0.5, second


def test_failed_save_raises_on_next_save_and_flush_once(tmp_path: Path) -> None:
    m = Model()
    ck = m.register(_ck(tmp_path, storage=Broken(tmp_path)))
    ck.save(1)
    with pytest.raises(SaveFailedError, match=r"step 1 failed and was not committed: .*disk on fire"):
        ck.save(2)
    ck.flush()  # surfaced once; save(2) was refused, nothing is in flight
    ck.save(4)
    with pytest.raises(SaveFailedError, match="step 4"):
        ck.flush()
    ck.flush()  # raised once; nothing pending now
    assert ck.latest_valid() is None
    ck.close()


def test_simulated_ranks_each_restore_their_own(tmp_path: Path) -> None:
    def ranked(rank: int) -> tuple[Checkpointer, ResumableSampler, TrainState]:
        sampler = ResumableSampler(10, seed=1, rank=rank, world_size=2)
        train = TrainState()
        ck = _ck(tmp_path, rank=rank, world_size=2)
        ck.register("data", sampler)
        ck.register("train", train)
        return ck, sampler, train

    ck1, s1, _ = ranked(1)
    ck0, s0, t0 = ranked(0)
    next(iter(s1))
    it = iter(s0)
    next(it), next(it)
    t0.step = 3
    ck1.save(3, blocking=True)  # rank 1 uploads its part and a rank manifest
    assert not (tmp_path / layout.commit_key(3)).exists()
    ck0.save(3, blocking=True)  # rank 0 collects it, verifies everything, commits
    commit = json.loads((tmp_path / layout.commit_key(3)).read_text())
    assert commit["world_size"] == 2
    assert [o["key"] for o in commit["components"]["data"]] == ["data.rank0.pt", "data.rank1.pt"]
    assert [o["key"] for o in commit["components"]["train"]] == ["train.pt"]
    for ck in (ck0, ck1):
        ck.close()

    for rank, index in ((0, 2), (1, 1)):
        ck, sampler, train = ranked(rank)
        assert ck.restore() == 3
        assert sampler.index == index and train.step == 3
        ck.close()
    # At another world size the data position is split anew, which needs ranks in lockstep (these are
    # not): refused on every rank, nothing loaded.
    solo = _ck(tmp_path)
    solo.register("data", ResumableSampler(10, seed=1))
    solo.register("train", solo_train := TrainState())
    with pytest.raises(CheckpointError, match=r"data positions differ \(\[\(0, 1\), \(0, 2\)\]\): not in lockstep"):
        solo.restore()
    assert solo_train.step == 0
    solo.close()


class _PerRankCounter:
    """A per-rank component that does not say how to reshard itself."""

    checkpoint_per_rank = True

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


def test_a_checkpoint_of_2_ranks_is_refused_on_every_rank_of_4_for_a_component_that_cannot_reshard(
    tmp_path: Path,
) -> None:
    """Also the ranks that have a state of their own in it (0 and 1): none of them restores alone."""
    for rank in (1, 0):
        ck = _ck(tmp_path, rank=rank, world_size=2)
        ck.register("count", _PerRankCounter())
        ck.register("train", TrainState())
        ck.save(5, blocking=True)
        ck.close()
    for rank in range(4):
        ck = _ck(tmp_path, rank=rank, world_size=4)
        train = TrainState()
        ck.register("count", _PerRankCounter())
        ck.register("train", train)
        want = (r"'count', key 'world_size': saved with world_size 2, this run has 4" if rank < 2
                else r"'count', key 'rank\d': no state for rank \d: saved with world_size 2, this run has 4")
        with pytest.raises(StateMismatchError, match=want):
            ck.restore()
        assert train.step == 0  # nothing loaded
        ck.close()


def test_rng_and_data_position_reshard_from_2_ranks_to_4(tmp_path: Path) -> None:
    """Rank r < 2 continues saved rank r's streams, ranks 2 and 3 keep their own; the 2 x 6 samples used
    are split over 4 ranks (3 each), so the next samples continue the global order."""
    saved_rng = []
    for rank in (1, 0):
        ck = _ck(tmp_path, rank=rank, world_size=2)
        torch.manual_seed(10 + rank)
        rng, sampler = RNGState(), ResumableSampler(40, seed=3, rank=rank, world_size=2)
        sampler.index = 6
        ck.register("rng", rng)
        ck.register("data", sampler)
        saved_rng.insert(0, torch.get_rng_state())
        ck.save(5, blocking=True)
        ck.close()
    upcoming = []
    for rank in range(4):
        torch.manual_seed(100 + rank)
        own = torch.get_rng_state()
        ck = _ck(tmp_path, rank=rank, world_size=4)
        sampler = ResumableSampler(40, seed=3, rank=rank, world_size=4)
        ck.register("rng", RNGState())
        ck.register("data", sampler)
        assert ck.restore() == 5
        assert torch.equal(torch.get_rng_state(), saved_rng[rank] if rank < 2 else own)
        assert (sampler.epoch, sampler.index) == (0, 3)
        upcoming.append(list(iter(sampler))[:2])
        ck.close()
    order = ResumableSampler(40, seed=3)._order(0)
    assert sorted(i for pair in upcoming for i in pair) == sorted(order[12:20])


class Custom:
    """A component whose state holds a Python object that weights_only loading refuses."""

    def __init__(self) -> None:
        self.value: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"obj": Thing(3)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["obj"]


class Thing:
    def __init__(self, n: int) -> None:
        self.n = n


def test_custom_objects_need_weights_only_false_and_model_stays_untouched(tmp_path: Path) -> None:
    m = Model()
    with m.register(_ck(tmp_path)) as ck:
        ck.register("custom", Custom())
        m.at(5)
        ck.save(5, blocking=True)
    fresh = Model()
    before = fresh.net.weight.detach().clone()
    with fresh.register(_ck(tmp_path)) as ck:
        ck.register("custom", Custom())
        with pytest.raises(CheckpointError, match=r"'custom': cannot load custom.pt.*weights_only=False"):
            ck.restore()
    assert torch.equal(fresh.net.weight.detach(), before)
    custom = Custom()
    with fresh.register(_ck(tmp_path, weights_only=False)) as ck:
        ck.register("custom", custom)
        assert ck.restore() == 5
    assert custom.value.n == 3


def test_component_missing_from_checkpoint(tmp_path: Path) -> None:
    with Model().register(_ck(tmp_path)) as ck:
        ck.save(1, blocking=True)
    with Model().register(_ck(tmp_path)) as ck:
        ck.register("ema", torch.nn.Linear(3, 4))
        with pytest.raises(StateMismatchError, match="'ema', key '': not in the checkpoint of step 1"):
            ck.restore()


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="keep_last must be at least 2"):
        _ck(tmp_path, keep_last=1)
    ck = _ck(tmp_path)
    with pytest.raises(CheckpointError, match="no components registered"):
        ck.save(1)
    with pytest.raises(CheckpointError, match="no state_dict"):
        ck.register("x", object())
    with pytest.raises(CheckpointError, match="must be"):
        ck.register("a/b", torch.nn.Linear(1, 1))
    ck.register("m", torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointError, match="already registered"):
        ck.register("m", torch.nn.Linear(1, 1))
    ck.close()
    with pytest.raises(CheckpointError, match="closed"):
        ck.save(1)
    with pytest.raises(TargetError, match="unknown checkpoint target scheme 'gs'"):
        Checkpointer("gs://b/p", handle_sigterm=False)


@pytest.mark.skipif(os.path.ismount("/mnt/s3"), reason="the bucket is mounted here")
def test_unmounted_bucket_path_is_refused() -> None:
    with pytest.raises(TargetError, match="not mounted"):
        Checkpointer(f"/mnt/s3/{layout.RUNS_PREFIX}x", handle_sigterm=False)


def test_with_retry_backs_off_then_gives_up() -> None:
    calls = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Transient("connection refused")
        return "ok"

    state = random.getstate()
    assert with_retry("op", flaky, RetryPolicy(attempts=5, base_s=0.05, max_s=0.1, deadline_s=5)) == "ok"
    assert len(calls) == 3
    assert random.getstate() == state, "backoff jitter must not draw from the training loop's RNG"

    def dead() -> None:
        raise Transient("connection refused")

    with pytest.raises(StorageError, match=r"op failed after 3 attempts.*connection refused"):
        with_retry("op", dead, RetryPolicy(attempts=3, base_s=0.01, max_s=0.01, deadline_s=5))


def test_stateful_dataloader_is_per_rank_and_round_trips(tmp_path: Path) -> None:
    from torchdata import stateful_dataloader as sdl  # the dev extra has it: this test never skips

    data = list(range(20))
    loader = sdl.StatefulDataLoader(data, batch_size=4)
    it = iter(loader)
    next(it)
    with _ck(tmp_path) as ck:
        ck.register("data", loader)
        ck.save(1, blocking=True)
    assert (tmp_path / layout.step_prefix(1) / "data.rank0.pt").exists()
    fresh = sdl.StatefulDataLoader(data, batch_size=4)
    with _ck(tmp_path) as ck:
        ck.register("data", fresh)
        assert ck.restore() == 1
    assert next(iter(fresh)).tolist() == [4, 5, 6, 7]


# -- process exit ------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    import torch
    from glue.train import Checkpointer, TrainState
    from glue.train.storage.folder import FileStorage

    class Slow(FileStorage):
        def put(self, key, data):
            time.sleep(0.3)
            super().put(key, data)

    root, mode = Path(sys.argv[1]), sys.argv[2]
    ck = Checkpointer(str(root), storage=Slow(root))
    ck.register("model", torch.nn.Linear(2, 2))
    ck.register("train", TrainState())
    ck.save(1)
    print("saved", flush=True)
    if mode == "fork":
        # A forked child (a DataLoader worker) inherits the SIGTERM handler, not the uploader thread.
        ready_r, ready_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(ready_w, b"r")  # a signal that lands while fork() is still returning in the child is lost
            for _ in range(600):
                time.sleep(0.1)
            os._exit(0)
        os.read(ready_r, 1)
        os.kill(child, signal.SIGTERM)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid:
                print("child", os.waitstatus_to_exitcode(status), flush=True)
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            print("child hung", flush=True)
    if mode == "sigterm":
        # Short sleeps, as a training loop keeps running Python: a process-directed SIGTERM can land on
        # one of the checkpointer's threads, and then a single long sleep would hold off the handler.
        for _ in range(600):
            time.sleep(0.1)
    """
)


@pytest.mark.timeout(60)
def test_pending_save_is_flushed_on_sigterm_and_on_normal_exit(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path / mode), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for mode in ("sigterm", "exit")
    }
    p = procs["sigterm"]
    assert p.stdout is not None and p.stdout.readline().strip() == "saved"
    p.send_signal(signal.SIGTERM)  # arrives while the save is still uploading (0.3 s per object)
    for mode, proc in procs.items():
        _, err = proc.communicate(timeout=30)
        expected = -signal.SIGTERM if mode == "sigterm" else 0
        assert proc.returncode == expected, f"{mode}: exit {proc.returncode}\n{err}"
        with _ck(tmp_path / mode) as ck:
            assert ck.latest_valid() == 1, f"{mode}: the in-flight save was lost"


@pytest.mark.timeout(60)
def test_a_forked_child_ends_on_sigterm_without_flushing_the_parents_save(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), "fork"], capture_output=True, text=True,
                         env=env, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["saved", f"child {-signal.SIGTERM}"], out.stdout
    with _ck(tmp_path) as ck:
        assert ck.latest_valid() == 1  # the parent still flushed its own save at exit


def test_sigterm_handler_chains_to_the_previous_one(tmp_path: Path) -> None:
    seen = []
    prev = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with Model().register(Checkpointer(str(tmp_path))) as ck:
            ck.save(1)
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                time.sleep(0.01)
            assert seen == [signal.SIGTERM]
            assert ck.last_committed_step == 1  # flushed before the previous handler ran
    finally:
        signal.signal(signal.SIGTERM, prev)

"""Sharded state (FSDP2 DTensors) through glue.train's DCP path: tiny_gpt with `parallel: fsdp`, ranks on
gloo over 127.0.0.1. Every rank writes its own shards, rank 0 commits after verifying all of them;
the same world size resumes bitwise, another world size gets the same full state back (resharded)
and the data position split anew."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from glue.examples import tiny_gpt
from glue.train import Checkpointer, CheckpointError, layout
from tests.integration.test_ckpt_toy import S3Conn, free_port, fresh_context, start_and_join

CFG = {"steps": 8, "checkpoint_interval": 4, "parallel": "fsdp", "corpus_chars": 5000, "seq_len": 16,
       "d_model": 32, "n_layer": 2, "n_head": 4, "batch_size": 8}


class _Losses:
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def step(self, step: int, loss: float, **_: Any) -> None:
        self.losses[step] = loss


def _full(result: dict[str, Any]) -> dict[str, Any]:
    """The whole model and optimizer state, gathered (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": tiny_gpt.full_state(result["model"]),
            "optimizer": get_optimizer_state_dict(result["model"], result["optimizer"], options=opts)}


def _worker(rank: int, world: int, port: int, target: str, conn: S3Conn | None, cfg: dict[str, Any],
            resume: bool, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report: dict[str, Any] = {}
    try:
        ck = Checkpointer(target, handle_sigterm=False, **(conn.kwargs() if conn else {}))
        seen = _Losses()
        try:
            result = tiny_gpt.train(dict(tiny_gpt.DEFAULTS, **cfg), ck, resume, report=seen)
        except CheckpointError as exc:
            report["error"] = str(exc)
        else:
            full = _full(result)
            ck.close()
            sampler = result["sampler"]
            report.update(losses=seen.losses, step=result["step"], position=(sampler.epoch, sampler.index),
                          full=full if rank == 0 else None)
        torch.save(report, out)
    finally:
        # Not torn down (see test_ckpt_ddp: ~ProcessGroupGloo can deadlock at exit); the report is written.
        os._exit(0)


def _launch(world: int, target: str, tmp_path: Path, *, resume: bool, conn: S3Conn | None = None,
            **cfg: Any) -> list[dict[str, Any]]:
    ctx = fresh_context()
    port = free_port()
    outs = [str(tmp_path / f"{uuid.uuid4().hex[:8]}-{r}.pt") for r in range(world)]
    procs = [ctx.Process(target=_worker, args=(r, world, port, target, conn, {**CFG, **cfg}, resume, outs[r]))
             for r in range(world)]
    assert start_and_join(procs, 180) == [0] * world
    return [torch.load(o, weights_only=False) for o in outs]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        same_len = isinstance(b, (list, tuple)) and len(a) == len(b)
        return same_len and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _copy_without(src: Path, dst: Path, step: int) -> str:
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "ckpt" / f"step-{step}")
    return str(dst)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """An uninterrupted 2-rank run of 8 steps, checkpointed at 4 and 8 to a folder."""
    tmp = tmp_path_factory.mktemp("sharded")
    ranks = _launch(2, str(tmp / "ref"), tmp, resume=False)
    return tmp / "ref", ranks


@pytest.mark.timeout(300)
def test_every_rank_writes_its_shards_and_rank0_commits_them_all(reference: Any) -> None:
    target, _ = reference
    commit = json.loads((target / layout.commit_key(4)).read_text())
    assert commit["world_size"] == 2
    assert sorted(commit["sharded"]) == ["model", "optimizer"]
    for name in ("model", "optimizer"):
        # each rank's own shards (with their DCP metadata), each object with its size and sha256
        assert [(o["key"], o.get("rank")) for o in commit["components"][name]] == [
            (f"{name}.rank0.pt", 0), (f"{name}.rank1.pt", 1)]
        for o in commit["components"][name]:
            assert (target / "ckpt" / "step-4" / o["key"]).stat().st_size == o["size"]
    assert [o["key"] for o in commit["rank_manifests"]] == ["rank1.json"]
    # The step directory holds nothing COMMIT.json does not list: nothing renamed, no temporary file.
    listed = {o["key"] for objs in commit["components"].values() for o in objs}
    listed |= {layout.rank_part_key(1), layout.COMMIT}
    assert {p.name for p in (target / "ckpt" / "step-4").iterdir()} == listed


@pytest.mark.timeout(300)
def test_resume_at_the_same_world_size_is_bitwise(reference: Any, tmp_path: Path, local_bucket: Any) -> None:
    target, ref = reference
    resumed = _launch(2, _copy_without(target, tmp_path / "t", 8), tmp_path, resume=True)
    assert resumed[0]["losses"] == {s: ref[0]["losses"][s] for s in range(5, 9)}
    assert _equal(resumed[0]["full"], ref[0]["full"])
    # The same through S3 (the parallel transfer path): saved, then resumed from step 4.
    conn = S3Conn(local_bucket.info.endpoint, local_bucket.creds.access_key, local_bucket.creds.secret_key)
    s3 = layout.run_uri(local_bucket.info.name, f"sharded-{uuid.uuid4().hex[:8]}")
    _launch(2, s3, tmp_path, resume=False, conn=conn, steps=8, checkpoint_interval=4)
    client, bucket = local_bucket.client(), local_bucket.info.name
    prefix = s3.split("/", 3)[3]
    listed_8 = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{layout.step_prefix(8)}")["Contents"]
    for key in [o["Key"] for o in listed_8]:
        client.delete_object(Bucket=bucket, Key=key)
    again = _launch(2, s3, tmp_path, resume=True, conn=conn)
    assert again[0]["losses"] == {s: ref[0]["losses"][s] for s in range(5, 9)}


@pytest.mark.timeout(300)
def test_saves_from_a_kept_plan_restore_exactly(tmp_path: Path) -> None:
    # Saves at 2, 4 and 6: DCP plans the first, the others reuse its plan (the learning rate changes
    # every step). Restored at the same world size (the saved chunks taken as they are, no DCP): the
    # state that was saved, learning rate included.
    target = str(tmp_path / "ck")
    ran = _launch(2, target, tmp_path, resume=False, steps=6, checkpoint_interval=2)
    back = _launch(2, target, tmp_path, resume=True, steps=6)
    assert back[0]["step"] == 6
    assert _equal(back[0]["full"], ran[0]["full"])


@pytest.mark.timeout(400)
def test_a_checkpoint_saved_by_2_ranks_restores_at_1_and_at_4(reference: Any, tmp_path: Path) -> None:
    target, _ = reference
    # Restore only (steps = the checkpoint's step): the gathered full state right after the restore.
    at = {w: _launch(w, _copy_without(target, tmp_path / f"w{w}", 8), tmp_path, resume=True, steps=4)
          for w in (2, 1, 4)}
    saved = at[2][0]["full"]
    assert saved is not None and at[2][0]["step"] == 4
    for w in (1, 4):
        assert at[w][0]["step"] == 4
        assert _equal(at[w][0]["full"], saved), f"the state restored at world size {w} differs from the saved one"
        # 4 steps of 8 samples on each of 2 ranks: 64 samples of epoch 0 were used, whatever the split now.
        assert {r["position"] for r in at[w]} == {(0, 64 // w)}


@pytest.mark.timeout(300)
def test_a_data_position_that_cannot_be_split_is_refused(reference: Any, tmp_path: Path) -> None:
    target, _ = reference
    ranks = _launch(3, _copy_without(target, tmp_path / "t", 8), tmp_path, resume=True, steps=4)
    assert all("cannot be split evenly over 3 ranks" in r["error"] for r in ranks), ranks


@pytest.mark.timeout(300)
def test_a_checkpoint_of_another_model_shape_names_the_key(reference: Any, tmp_path: Path) -> None:
    target, _ = reference
    (ranks,) = [_launch(1, _copy_without(target, tmp_path / "t", 8), tmp_path, resume=True, steps=4, d_model=48)]
    assert ranks[0]["error"].startswith("checkpoint component 'model', key 'tok.weight': checkpoint has shape"), ranks

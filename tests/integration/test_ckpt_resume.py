"""Bitwise resume: N uninterrupted steps == M steps + save + a NEW process that restores and runs N-M."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.train import Checkpointer, layout, validate_checkpoints
from tests.integration.test_ckpt_toy import S3Conn, fingerprint, in_fresh_process, make_toy, register, run, same


def _first(target: str, conn: S3Conn | None, m: int, n: int, out: str, blocking: bool) -> None:
    """Trains n steps without interruption, saving after step m (the save must not disturb anything)."""
    toy = make_toy(seed=0)
    ck = register(Checkpointer(target, **(conn.kwargs() if conn else {})), toy)
    losses = run(toy, 0, m)
    ck.save(m, blocking=blocking)
    losses += run(toy, m, n)
    ck.close()
    torch.save({"losses": losses, "fp": fingerprint(toy), "sampler": toy.sampler.state_dict()}, out)


def _resumed(target: str, conn: S3Conn | None, m: int, n: int, out: str) -> None:
    # Different seeds everywhere: whatever matches must have come from the checkpoint.
    toy = make_toy(seed=999)
    ck = register(Checkpointer(target, **(conn.kwargs() if conn else {})), toy)
    start = ck.restore()
    assert start == m, start
    assert toy.train.step == m
    losses = run(toy, m, n)
    ck.save(n, blocking=True)
    ck.close()
    torch.save({"losses": losses, "fp": fingerprint(toy), "sampler": toy.sampler.state_dict()}, out)


def _check(target: str, conn: S3Conn | None, tmp_path: Path, m: int, n: int, blocking: bool) -> None:
    ref, res = str(tmp_path / "ref.pt"), str(tmp_path / "res.pt")
    in_fresh_process(_first, target, conn, m, n, ref, blocking)
    in_fresh_process(_resumed, target, conn, m, n, res)
    a = torch.load(ref, weights_only=True)
    b = torch.load(res, weights_only=True)
    assert b["losses"] == a["losses"][m:], "per-step losses differ after resume"
    assert same(a["fp"], b["fp"]), "parameters / optimizer state differ after resume"
    assert a["sampler"] == b["sampler"]
    # The resumed process recorded how long its restore took in the next checkpoint's COMMIT.json.
    status = validate_checkpoints(target, **(conn.kwargs() if conn else {}))
    assert [s.step for s in status if s.valid] == [n, m]
    restore = status[0].commit.timings["restore"] if status[0].commit else None
    assert restore and restore["from_step"] == m and restore["bytes"] > 0 and restore["load_s"] >= 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("m", "n", "blocking"), [(6, 14, False), (9, 17, True)], ids=["epoch-end", "mid-epoch"])
def test_bitwise_resume_s3(local_bucket: Any, tmp_path: Path, m: int, n: int, blocking: bool) -> None:
    conn = S3Conn(local_bucket.info.endpoint, local_bucket.creds.access_key, local_bucket.creds.secret_key)
    _check(layout.run_uri(local_bucket.info.name, f"resume-{uuid.uuid4().hex[:8]}"), conn, tmp_path, m, n, blocking)


@pytest.mark.timeout(240)
def test_bitwise_resume_filesystem_mid_epoch(tmp_path: Path) -> None:
    _check(str(tmp_path / "bucket" / "runs" / "r1"), None, tmp_path, 9, 15, False)

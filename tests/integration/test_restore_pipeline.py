"""Restore against the real rclone S3 server: objects move as parallel ranged GETs straight into one
buffer, are verified, and are deserialized while the others still download, with tensors that are
views of that buffer. These tests hold what a user relies on through that: a restored run continues
exactly as the saved one would have, the first problem in COMMIT.json order is the one reported
whichever download finishes first, and nothing is loaded from a step with any bad object."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch
from boto3.s3.transfer import TransferConfig

from glue.train import Checkpointer, TrainState, layout
from glue.train.checkpoint.format import ObjectRef
from glue.train.checkpoint.load import deserialize
from glue.train.storage.buffers import BlobReader

MiB = 1024 * 1024
PART = 5 * MiB
SMALL = TransferConfig(
    multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=4, io_chunksize=300_001, max_io_queue=16
)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 512, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _ckpt(local_bucket: Any, prefix: str) -> Checkpointer:
    info, creds = local_bucket.info, local_bucket.creds
    return Checkpointer(
        f"s3://{info.name}/{prefix}", endpoint_url=info.endpoint, credentials=lambda: creds, transfer=SMALL,
        handle_sigterm=False,
    )  # fmt: skip


@pytest.mark.timeout(180)
def test_a_restored_run_continues_exactly_like_the_saved_one(local_bucket: Any) -> None:
    prefix = f"{layout.RUNS_PREFIX}restore-{uuid.uuid4().hex[:8]}"
    model, opt = _model()
    _train(model, opt, 3, seed=1)
    with _ckpt(local_bucket, prefix) as ck:
        ck.register("model", model)
        ck.register("optimizer", opt)
        ck.save(3, blocking=True)
    model2, opt2 = _model()
    with _ckpt(local_bucket, prefix) as ck:
        ck.register("model", model2)
        ck.register("optimizer", opt2)
        assert ck.restore() == 3
    # The optimizer's moments now live in the downloaded buffer: stepping on must update them in
    # place exactly as the original's, several times over, with nothing shared between tensors.
    _train(model, opt, 4, seed=2)
    _train(model2, opt2, 4, seed=2)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for sa, sb in zip(opt.state.values(), opt2.state.values(), strict=True):
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


def test_deserialized_tensors_are_views_of_the_downloaded_bytes() -> None:
    # The restore's speed rests on this (no second allocation and copy of every byte); a torch
    # release that changes its internal loader must fail here rather than silently copy.
    import io

    state = {"w": torch.arange(1000, dtype=torch.float32), "n": 3}
    buf = io.BytesIO()
    torch.save(state, buf)
    body = bytearray(buf.getvalue())
    got = deserialize("x", ObjectRef("x.pt", len(body), ""), body, weights_only=True)
    assert torch.equal(got["w"], state["w"]) and got["n"] == 3
    base = torch.frombuffer(body, dtype=torch.uint8).data_ptr()
    assert base <= got["w"].data_ptr() < base + len(body), "tensor was copied out of the downloaded buffer"
    # and a body that is not a checkpoint is refused in one line, not loaded
    with pytest.raises(Exception, match="cannot load"):
        deserialize("x", ObjectRef("x.pt", 10, ""), bytearray(b"not a zip!"), weights_only=True)
    assert BlobReader(body).read(2) == b"PK"


@pytest.mark.timeout(180)
def test_the_first_bad_object_in_commit_order_is_reported_and_nothing_is_loaded(local_bucket: Any) -> None:
    prefix = f"{layout.RUNS_PREFIX}restore-{uuid.uuid4().hex[:8]}"
    model, opt = _model()
    train = TrainState()
    with _ckpt(local_bucket, prefix) as ck:
        ck.register("model", model)
        ck.register("optimizer", opt)
        ck.register("train", train)
        for step in (1, 2):
            _train(model, opt, 1, seed=step)
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float(step))
            ck.save(step, blocking=True)
    s3 = local_bucket.client()
    name = local_bucket.info.name
    # Corrupt the last part of the (large) optimizer object and the first of the (smaller) model
    # object: the optimizer's is found at any download order, model.pt comes first in COMMIT.json.
    for key, at in (("optimizer.pt", -100), ("model.pt", 100)):
        full = f"{prefix}/{layout.step_prefix(2)}{key}"
        body = bytearray(s3.get_object(Bucket=name, Key=full)["Body"].read())
        body[at] ^= 0x01
        s3.put_object(Bucket=name, Key=full, Body=bytes(body))
    fresh, opt2 = _model()
    with _ckpt(local_bucket, prefix) as ck:
        ck.register("model", fresh)
        ck.register("optimizer", opt2)
        ck.register("train", TrainState())
        assert ck.restore() == 1
        assert ck.last_restore is not None
        (skipped,) = ck.last_restore.skipped
        assert skipped.step == 2 and skipped.problems[0].object.endswith("step-2/model.pt")
        assert "sha256" in skipped.problems[0].what and len(skipped.problems) == 1
    assert all(bool((p == 1.0).all()) for p in fresh.parameters()), "step 1 is what was loaded"

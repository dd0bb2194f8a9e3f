"""Transfers against the real rclone S3 server with small parts, so that every object of interest is
a multipart upload and a parallel ranged download: the bytes and sha256 that come back are exactly
what went up, for sizes on and off part boundaries, and one flipped byte in a later part is caught."""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

import pytest
import torch
from boto3.s3.transfer import TransferConfig

from glue.train import Checkpointer, TrainState, layout
from glue.train.storage.s3 import S3Storage
from glue.train.storage.s3_client import make_s3_client

MiB = 1024 * 1024
PART = 5 * MiB  # the smallest part S3 accepts
# io chunks that do not divide the part size: chunk boundaries fall mid-part
SMALL = TransferConfig(
    multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=4, io_chunksize=300_001, max_io_queue=16
)


@pytest.fixture
def storage(local_bucket: Any) -> S3Storage:
    creds = local_bucket.creds
    client = make_s3_client(local_bucket.info.endpoint, credentials=lambda: creds)
    return S3Storage(local_bucket.info.name, f"{layout.RUNS_PREFIX}xfer-{uuid.uuid4().hex[:8]}", client, transfer=SMALL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 3 * PART + 12_345])
def test_round_trip_is_exact_on_and_off_part_boundaries(storage: S3Storage, local_bucket: Any, size: int) -> None:
    data = os.urandom(size)
    storage.put("obj.bin", bytearray(data))  # a bytearray, as torch.save's output is
    raw = local_bucket.client().get_object(Bucket=storage.bucket, Key=f"{storage.prefix}/obj.bin")["Body"].read()
    assert raw == data, "what was stored differs from what was put"
    for hint in (size, None, size // 2, size + PART):  # right, unknown, short and long size hints
        got, sha = storage.get("obj.bin", hint)
        assert bytes(got) == data, f"hint {hint}"
        assert sha == hashlib.sha256(data).hexdigest(), f"hint {hint}"


@pytest.mark.timeout(120)
def test_a_flipped_byte_in_a_later_part_is_caught(local_bucket: Any) -> None:
    info, creds = local_bucket.info, local_bucket.creds
    prefix = f"{layout.RUNS_PREFIX}xfer-{uuid.uuid4().hex[:8]}"
    target = f"s3://{info.name}/{prefix}"

    def ckpt() -> Checkpointer:
        return Checkpointer(
            target, endpoint_url=info.endpoint, credentials=lambda: creds, transfer=SMALL, handle_sigterm=False
        )

    model, train = torch.nn.Linear(1024, 3200), TrainState()  # model.pt: about 13 MB, 3 parts
    with ckpt() as ck:
        ck.register("model", model)
        ck.register("train", train)
        for step in (1, 2):
            with torch.no_grad():
                model.weight.fill_(float(step))
            ck.save(step)
    s3 = local_bucket.client()
    key = f"{prefix}/{layout.step_prefix(2)}model.pt"
    body = bytearray(s3.get_object(Bucket=info.name, Key=key)["Body"].read())
    assert len(body) > 2 * PART
    at = 2 * PART + 4321  # in the third part, downloaded in parallel with the first two
    body[at] ^= 0x01
    s3.put_object(Bucket=info.name, Key=key, Body=bytes(body))

    fresh, train2 = torch.nn.Linear(1024, 3200), TrainState()
    with ckpt() as ck:
        ck.register("model", fresh)
        ck.register("train", train2)
        assert ck.restore() == 1
        assert ck.last_restore is not None
        (skipped,) = ck.last_restore.skipped
        assert skipped.step == 2 and "sha256" in skipped.problems[0].what
        assert skipped.problems[0].object.endswith("model.pt")
    assert bool((fresh.weight == 1.0).all())

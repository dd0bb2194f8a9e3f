"""Checkpoints against the real rclone S3 server: format, corruption, bad input, outages, credentials."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from glue.train import (
    Checkpointer,
    CorruptCheckpointError,
    RetryPolicy,
    RNGState,
    SaveFailedError,
    StateMismatchError,
    TargetError,
    TrainState,
    layout,
    validate_checkpoints,
)


@dataclass
class Creds:
    access_key: str
    secret_key: str
    session_token: str | None = None
    expires_at: float | None = None


class Env:
    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket
        self.name = bucket.info.name
        self.prefix = f"{layout.RUNS_PREFIX}t-{uuid.uuid4().hex[:10]}"
        self.target = f"s3://{self.name}/{self.prefix}"
        self.s3 = bucket.client()

    def creds(self) -> Creds:
        return Creds(self.bucket.creds.access_key, self.bucket.creds.secret_key)

    def ckpt(self, **kw: Any) -> Checkpointer:
        kw.setdefault("handle_sigterm", False)
        return Checkpointer(self.target, endpoint_url=self.bucket.info.endpoint, credentials=self.creds, **kw)

    def keys(self, sub: str = "") -> list[str]:
        resp = self.s3.list_objects_v2(Bucket=self.name, Prefix=f"{self.prefix}/{sub}")
        return sorted(o["Key"][len(self.prefix) + 1 :] for o in resp.get("Contents", []))

    def read(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=self.name, Key=f"{self.prefix}/{key}")["Body"].read())

    def write(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.name, Key=f"{self.prefix}/{key}", Body=body)

    def incidents(self) -> list[dict[str, Any]]:
        return [json.loads(self.read(k)) for k in self.keys(layout.INCIDENTS_PREFIX)]


@pytest.fixture
def env(local_bucket: Any) -> Iterator[Env]:
    yield Env(local_bucket)
    local_bucket.server.ensure_running()  # a test that stopped it must not break the next one


class Small:
    """A model whose every value says which step it was saved at."""

    def __init__(self, width: int = 8) -> None:
        self.model = torch.nn.Linear(4, width)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.train = TrainState()
        self.rng = RNGState()

    def at(self, step: int) -> Small:
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float(step))
        self.train.step = step
        return self

    def register(self, ck: Checkpointer) -> Checkpointer:
        ck.register("model", self.model)
        ck.register("optimizer", self.opt)
        ck.register("train", self.train)
        ck.register("rng", self.rng)
        return ck


def _saved(env: Env, steps: list[int], keep_last: int = 2) -> Small:
    s = Small()
    # One real optimizer step so the optimizer has per-parameter state (momentum buffers).
    s.model(torch.ones(1, 4)).sum().backward()
    s.opt.step()
    with s.register(env.ckpt(keep_last=keep_last)) as ck:
        for step in steps:
            s.at(step)
            ck.save(step)
    return s


@pytest.mark.timeout(60)
def test_commit_json_format_and_pruning(env: Env) -> None:
    _saved(env, [10, 20, 30, 40])
    steps = sorted({int(k.split("/")[1][5:]) for k in env.keys(layout.CKPT_PREFIX)})
    assert steps == [30, 40], "keep_last=2 keeps exactly the two newest"
    commit = json.loads(env.read(layout.commit_key(40)))
    assert commit["step"] == 40 and commit["world_size"] == 1 and commit["format"] == "gpukit-ckpt/1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", commit["created_at"])
    assert set(commit["components"]) == {"model", "optimizer", "train", "rng"}
    assert commit["components"]["rng"][0]["key"] == "rng.rank0.pt"  # per-rank by default
    for objs in commit["components"].values():
        for o in objs:
            body = env.read(layout.step_prefix(40) + o["key"])
            assert len(body) == o["size"] and hashlib.sha256(body).hexdigest() == o["sha256"]
    t = commit["timings"]
    for k in ("snapshot_s", "serialize_s", "upload_s", "verify_s", "bytes", "wait_s"):
        assert k in t, k
    assert t["bytes"] == sum(o["size"] for objs in commit["components"].values() for o in objs)
    listed = {layout.step_prefix(40) + o["key"] for objs in commit["components"].values() for o in objs}
    assert set(env.keys(layout.step_prefix(40))) == listed | {layout.commit_key(40)}


def _flip(body: bytes, at: int) -> bytes:
    return body[:at] + bytes([body[at] ^ 0x40]) + body[at + 1 :]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "obj", "what"),
    [
        ("truncate", "model.pt", "size"),
        ("flip", "optimizer.pt", "sha256"),
        ("no_commit", layout.COMMIT, "COMMIT.json is missing"),
        ("stray", "extra.bin", "stray object"),
        ("bad_commit", layout.COMMIT, "not valid JSON"),
    ],
)
def test_corruption_is_detected_and_skipped(env: Env, damage: str, obj: str, what: str) -> None:
    _saved(env, [1, 2, 3], keep_last=3)
    key = layout.step_prefix(3) + obj
    if damage == "truncate":
        env.write(key, env.read(key)[:-100])
    elif damage == "flip":
        body = env.read(key)
        env.write(key, _flip(body, len(body) // 2))
    elif damage == "no_commit":
        env.s3.delete_object(Bucket=env.name, Key=f"{env.prefix}/{key}")
    elif damage == "stray":
        env.write(key, b"left over")
    elif damage == "bad_commit":
        env.write(key, env.read(key)[:50])

    s = Small(width=8)
    ck = s.register(env.ckpt())
    assert ck.latest_valid() == 2
    assert ck.restore() == 2
    assert all(bool((p == 2.0).all()) for p in s.model.parameters()), "loaded the corrupt step"
    assert s.train.step == 2
    assert ck.last_restore is not None and [x.step for x in ck.last_restore.skipped] == [3]
    (incident,) = env.incidents()
    routine = damage == "no_commit"  # an interrupted save, not corruption
    assert incident["class"] == ("ckpt_interrupted" if routine else "ckpt_corrupt")
    assert incident["step"] == 3 and incident["fell_back_to"] == 2
    assert incident["object"].endswith(key) and what in incident["what"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*Z", incident["at"])
    moved = env.keys(layout.INVALID_PREFIX)
    if routine:
        assert moved == []  # prune removes an interrupted save's leftovers later
    else:  # the evidence is kept, out of the way of prune and of a later save of step 3
        assert any(k.endswith(f"/step-3/{obj}") for k in moved) and not env.keys(layout.step_prefix(3))
    status = {x.step: x for x in validate_checkpoints(env.target, endpoint_url=env.bucket.info.endpoint,
                                                      credentials=env.creds)}
    assert (3 not in status or not status[3].valid) and status[2].valid and status[1].valid
    with pytest.raises(CorruptCheckpointError, match="step 3"):
        s.register(env.ckpt()).restore(step=3)
    ck.close()


@pytest.mark.timeout(60)
def test_all_invalid_restores_nothing_and_records_each(env: Env) -> None:
    _saved(env, [1, 2], keep_last=2)
    for step in (1, 2):
        env.s3.delete_object(Bucket=env.name, Key=f"{env.prefix}/{layout.commit_key(step)}")
    s = Small()
    before = s.model.weight.detach().clone()
    with s.register(env.ckpt()) as ck:
        assert ck.restore() is None
        assert ck.latest_valid() is None
    assert torch.equal(before, s.model.weight)
    assert sorted(i["step"] for i in env.incidents()) == [1, 2]


# -- bad input ---------------------------------------------------------------------------------


def test_unknown_scheme() -> None:
    with pytest.raises(TargetError, match="unknown checkpoint target scheme 'gs'"):
        Checkpointer("gs://bucket/run", handle_sigterm=False)


@pytest.mark.timeout(60)
def test_missing_bucket(env: Env) -> None:
    with pytest.raises(TargetError, match="bucket 'no-such-bucket' does not exist"):
        Checkpointer("s3://no-such-bucket/run", endpoint_url=env.bucket.info.endpoint, credentials=env.creds)


@pytest.mark.timeout(60)
def test_wrong_credentials(env: Env) -> None:
    with pytest.raises(TargetError, match=r"denied|rejected"):
        Checkpointer(env.target, endpoint_url=env.bucket.info.endpoint, credentials=lambda: Creds("nobody", "x" * 30))


def test_no_credentials(env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(TargetError, match="no S3 credentials"):
        Checkpointer(env.target, endpoint_url=env.bucket.info.endpoint)


def test_env_credentials_work(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", env.bucket.creds.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env.bucket.creds.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", env.bucket.info.endpoint)
    with Small().register(Checkpointer(env.target, handle_sigterm=False)) as ck:
        ck.save(5, blocking=True)
        assert ck.latest_valid() == 5


@pytest.mark.timeout(60)
def test_different_model_shape_loads_nothing(env: Env) -> None:
    _saved(env, [7])
    other = Small(width=16)  # a different model
    other.train.step = 123
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    torch.manual_seed(99)
    rng_before = torch.get_rng_state()
    with other.register(env.ckpt()) as ck, pytest.raises(StateMismatchError) as err:
        ck.restore()
    msg = str(err.value)
    assert "'model'" in msg and "'weight'" in msg and "[8, 4]" in msg and "[16, 4]" in msg
    assert len(msg.splitlines()) == 1
    assert err.value.component == "model" and err.value.key == "weight"
    assert all(torch.equal(before[k], v) for k, v in other.model.state_dict().items())
    assert other.opt.state_dict()["state"] == {}
    assert other.train.step == 123
    assert torch.equal(torch.get_rng_state(), rng_before)


# -- outages -----------------------------------------------------------------------------------


def _stop_on_put(ck: Checkpointer, env: Env, match: str, after_stop: Any = None) -> threading.Event:
    """Stop the bucket server just before the first upload whose key contains `match`."""
    fired = threading.Event()
    real_put = ck.storage.put

    def put(key: str, data: bytes | bytearray) -> None:
        if match in key and not fired.is_set():
            fired.set()
            env.bucket.server.stop()
            if after_stop:
                after_stop()
        real_put(key, data)

    ck.storage.put = put  # type: ignore[method-assign]
    return fired


def _on_disk(env: Env, key: str) -> bool:
    return (env.bucket.server.data / env.name / env.prefix / key).exists()


@pytest.mark.timeout(120)
def test_bucket_stopped_mid_save_retries_and_commits(env: Env) -> None:
    s = Small()
    big = torch.nn.Linear(512, 2048)  # ~4 MB so the save has some substance
    ck = s.register(env.ckpt(retry=RetryPolicy(attempts=100, base_s=0.2, max_s=1.0, deadline_s=60)))
    ck.register("big", big)
    ck.save(1, blocking=True)

    def restart_later() -> None:
        threading.Timer(2.0, env.bucket.server.ensure_running).start()

    fired = _stop_on_put(ck, env, "step-2/model.pt", restart_later)
    py_rng = random.getstate()
    t0 = time.monotonic()
    ck.save(2)
    stall = time.monotonic() - t0
    assert stall < 1.0, f"save() blocked the training thread for {stall:.2f}s"
    # The training thread keeps working while the uploader retries against a dead server.
    assert fired.wait(5)
    for _ in range(20):
        big(torch.randn(8, 512)).sum().backward()
    assert not _on_disk(env, layout.commit_key(2))
    ck.flush()
    assert ck.last_committed_step == 2
    # Retrying (ours and boto's) never drew from the training loop's global `random` stream.
    assert random.getstate() == py_rng
    assert ck.last_save_timings["upload_s"] > 1.5  # includes the outage
    assert ck.latest_valid() == 2
    ck.close()


@pytest.mark.timeout(120)
def test_bucket_down_for_good_fails_loudly_and_keeps_previous(env: Env) -> None:
    s = Small()
    ck = s.register(env.ckpt(retry=RetryPolicy(attempts=100, base_s=0.2, max_s=0.5, deadline_s=3)))
    s.at(1)
    ck.save(1, blocking=True)
    _stop_on_put(ck, env, "step-2/")
    try:
        s.at(2)
        t0 = time.monotonic()
        ck.save(2)
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(SaveFailedError, match="step 2 failed"):
            ck.save(3)  # the failure surfaces on the next save (or flush)
        assert not _on_disk(env, layout.commit_key(2))
    finally:
        env.bucket.server.ensure_running()
    assert ck.latest_valid() == 1  # the previous valid checkpoint is intact
    ck.flush()  # the error was raised once; nothing is pending now
    s.at(3)
    ck.save(3, blocking=True)
    fresh = Small()
    with fresh.register(env.ckpt()) as ck2:
        assert ck2.restore() == 3
    assert float(fresh.model.weight.detach()[0, 0]) == 3.0
    ck.close()


# -- credentials -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_expiring_credentials_are_refreshed(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def sts() -> Creds:
        calls.append(time.time())
        # Already inside botocore's refresh window: every use asks for fresh credentials.
        return Creds(env.bucket.creds.access_key, env.bucket.creds.secret_key, None, time.time() + 30)

    caplog.set_level(logging.DEBUG, logger="glue.train")
    s = Small()
    ck = s.register(Checkpointer(env.target, endpoint_url=env.bucket.info.endpoint, credentials=sts,
                                 handle_sigterm=False))
    ck.save(1, blocking=True)
    n = len(calls)
    ck.save(2, blocking=True)
    assert len(calls) > n >= 2, "the credentials callback was not called again"
    assert ck.restore() == 2
    ck.close()
    assert env.bucket.creds.secret_key not in caplog.text

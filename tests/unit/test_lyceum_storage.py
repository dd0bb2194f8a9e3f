"""Lyceum's expiring bucket credentials: they really stop working, and the kit refreshes them mid-run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from glue.bucket_access import BucketCredentials
from glue.cloud.lyceum import bucket as lyceum_creds
from glue.cloud.lyceum.api import LyceumClient, RetryPolicy
from glue.cloud.lyceum.backend import LyceumBackend
from glue.storage import bucket as bucket_store
from glue.train import layout
from glue.train.storage.target import open_target
from tests.lyceum_emulator import Emulator

TTL = 1.5


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", boot_vms=False, credentials_ttl=TTL) as emulator:
        yield emulator


@pytest.fixture
def backend(emu: Emulator, tmp_path: Path) -> LyceumBackend:
    client = LyceumClient(emu.api_key, emu.url, retry=RetryPolicy(base_s=0.01, max_s=0.05))
    return LyceumBackend(tmp_path / "kit", client=client)


def put(backend: LyceumBackend, creds: BucketCredentials, key: str) -> None:
    bucket_store.client(backend.bucket(), creds).put_object(Bucket="gpukit", Key=key, Body=b"x")


def test_bucket_info_and_credentials_file(backend: LyceumBackend, emu: Emulator) -> None:
    info = backend.bucket()
    assert info.endpoint == emu.sts.endpoint and info.name == "gpukit" and info.region == "us-east-1"
    cred_file = backend.home / "bucket" / "credentials.json"
    assert oct(cred_file.stat().st_mode & 0o777) == "0o600"
    stored = json.loads(cred_file.read_text())
    assert {"access_key", "secret_key", "session_token", "expires_at", "endpoint", "bucket"} <= set(stored)
    creds = backend.bucket_credentials()
    assert creds.session_token and creds.expires_at and creds.access_key == stored["access_key"]
    # Fresh credentials are reused, not fetched again.
    issued = sum(1 for m, p, _ in emu.requests if p.endswith("/storage/credentials"))
    assert backend.bucket_credentials() == creds
    assert sum(1 for m, p, _ in emu.requests if p.endswith("/storage/credentials")) == issued


def test_fetching_credentials_is_retried(backend: LyceumBackend, emu: Emulator) -> None:
    """A POST, but a harmless one to repeat (it only issues another set): retried on 5xx and a lost answer."""
    emu.inject(503, count=1, path="/storage/credentials")
    emu.inject(0, count=1, path="/storage/credentials", drop=True, after_processing=True)
    assert backend.bucket_credentials().session_token
    assert [s for m, p, s in emu.requests if p.endswith("/storage/credentials")] == [503, 0, 200]


def test_expired_credentials_stop_working_and_are_refreshed(tmp_path: Path) -> None:
    """Expiry without waiting on the clock (a loaded machine could spend a short lifetime creating a client):
    the emulator expires the session, and the stored copy is aged past its expiry as time would age it."""
    with Emulator(tmp_path / "emu-long", boot_vms=False, credentials_ttl=600.0) as emu:
        backend = LyceumBackend(tmp_path / "kit-long", client=LyceumClient(
            emu.api_key, emu.url, retry=RetryPolicy(base_s=0.01, max_s=0.05)))
        old = backend.bucket_credentials()
        put(backend, old, "before-expiry")
        emu.sts.expire_all()
        with pytest.raises(ClientError) as err:
            put(backend, old, "after-expiry")
        assert err.value.response["Error"]["Code"] == "ExpiredToken"
        assert backend.bucket_credentials() == old  # still fresh by the stored expiry: kept, not fetched again
        cred_file = backend.home / "bucket" / "credentials.json"
        stored = json.loads(cred_file.read_text())
        cred_file.write_text(json.dumps({**stored, "expires_at": time.time() - 1}))
        new = backend.bucket_credentials()
        assert new.session_token != old.session_token and (new.expires_at or 0) > time.time()
        put(backend, new, "after-refresh")
        assert json.loads(cred_file.read_text())["session_token"] == new.session_token
        # A token that was replaced stays rejected, even where its key pair is handed out again.
        emu.sts.expire_all()
        with pytest.raises(ClientError):
            put(backend, new, "revoked")


def test_tampered_token_is_rejected(backend: LyceumBackend) -> None:
    creds = backend.bucket_credentials()
    forged = BucketCredentials(creds.access_key, creds.secret_key, "forged-token", creds.expires_at)
    with pytest.raises(ClientError) as err:
        put(backend, forged, "forged")
    assert err.value.response["Error"]["Code"] == "InvalidToken"


@pytest.mark.parametrize("callback", ["bucket_credentials", "credentials_callback"])
def test_checkpoint_writes_continue_across_expiries(backend: LyceumBackend, emu: Emulator, callback: str) -> None:
    """A writer running for several credential lifetimes never sees a failure."""
    cb = backend.bucket_credentials if callback == "bucket_credentials" else backend.credentials_callback()
    info = backend.bucket()
    storage = open_target(f"{layout.run_uri(info.name, 'r1')}/ckpt", endpoint_url=info.endpoint, credentials=cb)
    tokens = set()
    deadline = time.monotonic() + 3 * TTL
    n = 0
    while time.monotonic() < deadline:
        storage.put(f"step-{n}/blob", b"y" * 1024)
        tokens.add(json.loads((backend.home / "bucket" / "credentials.json").read_text())["session_token"])
        n += 1
        time.sleep(0.05)
    assert len(storage.list("")) == n
    assert len(tokens) >= 3  # the credentials really rotated underneath the writer
    assert "ExpiredToken" not in emu.sts.rejections


def test_credentials_answer_variants_are_understood() -> None:
    now = 1_700_000_000.0
    c = lyceum_creds.parse({"access_key": "a", "secret_key": "s", "session_token": "t",
                            "endpoint": "s3.lyceum.example", "bucket": "b", "expiration": "2023-11-14T22:13:20Z"},
                           now=now)
    assert c.endpoint == "https://s3.lyceum.example" and c.bucket == "b" and c.expires_at == now
    d = lyceum_creds.parse({"access_key": "a", "secret_key": "s", "endpoint": "http://x", "bucket_name": "b"}, now=now)
    assert d.expires_at == now + lyceum_creds.ASSUMED_TTL_S and d.session_token is None
    assert d.margin() == 225.0 and lyceum_creds.parse(
        {"access_key": "a", "secret_key": "s", "endpoint": "http://x", "bucket_name": "b", "expires_in": 7200},
        now=now).margin() == lyceum_creds.MAX_MARGIN_S

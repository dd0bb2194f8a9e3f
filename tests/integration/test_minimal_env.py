"""Servers the kit starts inherit nothing of the controller's environment (a user's API keys)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from glue.cloud.local.bucket import LocalBucket
from glue.storage import bucket as bucket_store

pytestmark = pytest.mark.integration

MARKER = "GPUKIT_TEST_MARKER_SECRET"


def test_the_bucket_server_gets_an_allow_listed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MARKER, "do-not-leak")
    monkeypatch.setenv("LYCEUM_API_KEY", "lk_do-not-leak")
    server = LocalBucket(tmp_path)
    info = server.ensure_running()
    try:
        pid = int(server._state()["pid"])
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0].decode() for e in environ if e}
        assert MARKER not in names and "LYCEUM_API_KEY" not in names
        assert b"do-not-leak" not in b"\0".join(environ)
        s3 = bucket_store.client(info, server.credentials())  # and it still serves
        s3.put_object(Bucket=info.name, Key="env/probe", Body=b"ok")
        assert bucket_store.read(s3, info.name, "env/probe") == b"ok"
    finally:
        server.stop()
    assert os.environ[MARKER] == "do-not-leak"

"""Reads of bucket records stay whole while the records are replaced, and a 5xx that carries a
checksum header is an ordinary, retried S3 error (botocore otherwise raises AttributeError)."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.storage import bucket
from glue.train import layout
from glue.train.storage.retry import RetryPolicy
from glue.train.storage.s3 import S3Storage
from glue.train.storage.s3_client import make_s3_client
from tests.conftest import BucketHandle

BODY = b'{"step": 7}'


def test_records_replaced_while_read_are_read_whole(local_bucket: BucketHandle) -> None:
    # rclone's local bucket, like a heartbeat in a run: one writer replaces a record, readers poll it.
    s3 = bucket.client(local_bucket.info, local_bucket.creds)
    key, stop = "reads/" + layout.heartbeat_key(0), threading.Event()
    s3.put_object(Bucket="gpukit", Key=key, Body=b'{"i": 0, "pad": ""}')

    def writer() -> None:
        w, i = bucket.client(local_bucket.info, local_bucket.creds), 0
        while not stop.is_set():
            i += 1  # sizes vary, so a torn read cannot parse into a consistent record
            w.put_object(Bucket="gpukit", Key=key, Body=json.dumps({"i": i, "pad": "x" * (i % 700)}).encode())

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    reads, deadline = 0, time.monotonic() + 5
    try:
        while time.monotonic() < deadline:
            rec = bucket.read_json(s3, "gpukit", key)
            assert rec is None or len(rec["pad"]) == rec["i"] % 700, rec  # None: rclone's brief gap on replace
            reads += 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert reads > 50


class _FlakyS3(BaseHTTPRequestHandler):
    """GetObject answers one 500 with a checksum header (as rclone does mid-replace), then the object."""

    gets = 0

    def log_message(self, *args: object) -> None:
        pass

    def _object_headers(self, status: int, length: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"0123456789abcdef"')
        self.send_header("Last-Modified", "Mon, 30 Nov 2026 00:00:00 GMT")
        self.send_header("x-amz-checksum-crc32", base64.b64encode(zlib.crc32(BODY).to_bytes(4, "big")).decode())
        self.end_headers()

    def do_HEAD(self) -> None:
        self._object_headers(200, len(BODY))

    def do_GET(self) -> None:
        type(self).gets += 1
        if type(self).gets == 1:
            err = b"<Error><Code>InternalError</Code><Message>file changed</Message></Error>"
            self._object_headers(500, len(err))
            self.wfile.write(err)
        else:
            self._object_headers(200, len(BODY))
            self.wfile.write(BODY)


@pytest.fixture
def flaky_s3() -> Iterator[str]:
    _FlakyS3.gets = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyS3)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_controller_client_retries_a_5xx_with_a_checksum_header(flaky_s3: str) -> None:
    s3 = bucket.client(BucketInfo(flaky_s3, "gpukit", "local"), BucketCredentials("AKIDEXAMPLE", "secret"))
    assert bucket.read_json(s3, "gpukit", layout.run_prefix("x") + layout.heartbeat_key(0)) == {"step": 7}
    assert _FlakyS3.gets == 2


def test_trainer_storage_retries_a_5xx_with_a_checksum_header(flaky_s3: str, tmp_path: Path) -> None:
    client = make_s3_client(flaky_s3, credentials=lambda: BucketCredentials("AKIDEXAMPLE", "secret"))
    storage = S3Storage("gpukit", "ckpt", client, retry=RetryPolicy(attempts=3, base_s=0.01))
    data, _ = storage.get("step-10/model.pt")
    assert bytes(data) == BODY
    assert _FlakyS3.gets == 2


def test_records_of_another_shape_are_one_line_naming_them(local_bucket: BucketHandle) -> None:
    """A manifest or attempt record that is JSON but not what glue wrote: one GlueError line naming the
    object (every command and a watcher of many runs rely on it), never a KeyError or TypeError."""
    from glue.errors import GlueError
    from glue.runs.store import RunStore

    store = RunStore(local_bucket.info, local_bucket.creds, "shapes")
    where = re.escape(store.prefix + layout.MANIFEST)
    for bad in ([1, 2], {}, {"config": "x"}):
        store.put_json(layout.MANIFEST, bad)
        for read in (store.manifest, store.read_manifest):  # the JSON as stored, and the type glue reads
            with pytest.raises(GlueError, match=rf"{where} in bucket gpukit is not a record glue wrote"):
                read()
    for n, bad_attempt in ((1, []), (2, {"attempt": 3})):
        store.put_json(layout.attempt_key(n), bad_attempt)
        for read_attempt in (store.attempt, store.read_attempt):
            with pytest.raises(GlueError, match=rf"{re.escape(layout.attempt_key(n))} .* is not a record glue wrote"):
                read_attempt(n)
    store.put_json(layout.MANIFEST, {"config": {}, "checkpoint": {"target": layout.run_uri("gpukit", "shapes")}})
    assert store.manifest()["config"] == {} and store.attempt(9) == {}
    assert store.read_manifest().config == {} and store.read_attempt(9) is None


def test_a_damaged_server_record_adopts_the_running_server(tmp_path: Path) -> None:
    """server.json lost or damaged while the bucket server runs: the next command finds that server (same
    pid, same port: the VMs' endpoint) instead of starting a second one over the same data, whose first
    could then never be found or stopped again."""
    import os

    from glue.cloud.local.bucket import LocalBucket

    def serving() -> list[int]:
        out = []
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if str(server.data).encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    out.append(int(p))
            except OSError:  # gone meanwhile
                continue
        return out

    server = LocalBucket(tmp_path)
    first = server.ensure_running()
    pid, port = json.loads(server.state_file.read_text())["pid"], int(first.endpoint.rsplit(":", 1)[1])
    try:
        for damage in ("garbage", "", '{"pid": 1}'):
            server.state_file.write_text(damage)
            assert server.ensure_running() == first
            assert json.loads(server.state_file.read_text()) == {"pid": pid, "port": port}
        assert serving() == [pid]
    finally:
        for p in serving():
            os.kill(p, 15)

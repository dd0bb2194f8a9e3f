"""A checkpoint target that is an S3 prefix, `s3://bucket/prefix` (boto3; large objects move in
parallel multipart parts). Missing buckets and rejected credentials fail at once (TargetError);
everything else is retried (glue.train.storage.retry).

Downloads of a known size (every checkpoint object: COMMIT.json and the listing give it) are
parallel ranged GETs read from the socket straight into one preallocated buffer, hashed as it
fills (buffers.PartSink); parts of one object must agree on its ETag. Any other download goes
through s3transfer."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.response import StreamingBody
from s3transfer.exceptions import RetriesExceededError

from glue.train.errors import ObjectMissingError, StorageError, TargetError
from glue.train.storage.buffers import BlobReader, HashingSink, PartSink
from glue.train.storage.retry import RetryPolicy, Transient, with_retry

T = TypeVar("T")
MiB = 1024 * 1024

# Codes that no amount of retrying fixes.
_PERMANENT = {
    "NoSuchBucket": "bucket does not exist",
    "AccessDenied": "access denied (credentials lack permission)",
    "InvalidAccessKeyId": "credentials rejected (unknown access key)",
    "SignatureDoesNotMatch": "credentials rejected (wrong secret key)",
    "InvalidBucketName": "invalid bucket name",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}

# Parts of 16 MiB, 8 in flight per object. Without a HEAD first (see s3_client), a download learns
# the object's size from its first part and only then asks for the rest in parallel: a small part
# keeps that serial start short. A download hands its bytes to its one writer thread in chunks of
# io_chunksize: 1 MiB instead of boto3's 256 KiB cuts that thread's per-chunk overhead (about 0.5 s
# of CPU per GB here), and at most max_io_queue chunks (128 MiB) wait for it. Downloads of a known
# size (S3Storage._get_parts) use the same part size, 8 parts in flight per target (one pool for all
# its downloads), and read io_chunksize at a time.
DEFAULT_TRANSFER = TransferConfig(
    multipart_threshold=16 * MiB,
    multipart_chunksize=16 * MiB,
    max_concurrency=8,
    io_chunksize=1 * MiB,
    max_io_queue=128,
    use_threads=True,
)


class S3Storage:
    """`s3://bucket/prefix`. Large objects go up and down in parallel multipart parts."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: Any,
        transfer: TransferConfig | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self.transfer = transfer or DEFAULT_TRANSFER
        self.retry = retry or RetryPolicy()
        # One pool of ranged GETs for every download of this target: parts of objects fetched at
        # once queue in the order their downloads began, so the first object completes first.
        self._parts: ThreadPoolExecutor | None = None
        self._parts_lock = threading.Lock()

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(
        self, what: str, op: Callable[[], T], missing_key: str | None = None, policy: RetryPolicy | None = None
    ) -> T:
        def attempt() -> T:
            try:
                return op()
            except ClientError as exc:
                err = exc.response.get("Error", {})
                code = str(err.get("Code", ""))
                if code in _PERMANENT:
                    raise TargetError(f"{self.describe()}: {_PERMANENT[code]}") from exc
                if missing_key is not None and code in _MISSING:
                    raise ObjectMissingError(missing_key) from exc
                raise Transient(f"{code or 'error'}: {err.get('Message', '')}".strip()) from exc
            except NoCredentialsError as exc:
                raise TargetError("no S3 credentials available") from exc
            except (BotoCoreError, Boto3Error, RetriesExceededError) as exc:
                raise Transient(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc

        return with_retry(f"{what} ({self.describe()})", attempt, policy or self.retry)

    def check(self) -> None:
        def head() -> None:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchBucket", "NotFound"):
                    raise TargetError(f"bucket {self.bucket!r} does not exist at {self._endpoint()}") from exc
                if code in ("403", "AccessDenied", "Forbidden"):
                    raise TargetError(f"access to bucket {self.bucket!r} denied: check the credentials") from exc
                raise

        # A short policy: a target that cannot be reached at start-up is reported, not waited for.
        quick = RetryPolicy(attempts=3, base_s=0.5, max_s=2.0, deadline_s=10.0)
        try:
            self._call("check bucket", head, policy=quick)
        except TargetError:
            raise
        except StorageError as exc:
            raise TargetError(f"cannot reach S3 endpoint {self._endpoint()}: {exc}") from exc

    def _endpoint(self) -> str:
        return str(getattr(self.client.meta, "endpoint_url", "?"))

    def put(self, key: str, data: bytes | bytearray) -> None:
        full = self._key(key)

        def up() -> None:
            # BlobReader, not io.BytesIO: that would copy a bytearray whole before the first part.
            self.client.upload_fileobj(BlobReader(data), self.bucket, full, Config=self.transfer)

        self._call(f"upload {key}", up)

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        full = self._key(key)

        def down() -> tuple[bytearray, str]:
            if size_hint:
                got = self._get_parts(full, size_hint)
                if got is not None:
                    return got
            # Size unknown (or not what the hint said): s3transfer learns it from the first part.
            sink = HashingSink(size_hint)
            self.client.download_fileobj(self.bucket, full, sink, Config=self.transfer)
            return sink.result()

        return self._call(f"download {key}", down, missing_key=key)

    def _pool(self) -> ThreadPoolExecutor:
        with self._parts_lock:
            if self._parts is None:
                workers = max(1, int(getattr(self.transfer, "max_concurrency", 8)))
                self._parts = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpukit-s3-part")
            return self._parts

    def _get_parts(self, full: str, size: int) -> tuple[bytearray, str] | None:
        """Parallel ranged GETs of an object of known size into one buffer, hashed as it fills.
        None when the object's size is not `size` (the caller then reads it whole)."""
        part = max(1, int(self.transfer.multipart_chunksize))
        sink = PartSink(size)
        pool = self._pool()
        futures = [pool.submit(self._get_part, full, sink, a, min(size, a + part)) for a in range(0, size, part)]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        wait(pending)  # a part still running writes into the buffer: let it finish before leaving
        answers = [f.result() for f in futures]  # raises the first failure
        if any(total != size for _, total in answers):
            return None
        if len({etag for etag, _ in answers}) > 1:
            raise Transient(f"{full} changed while its parts were read")
        return sink.result()

    def _get_part(self, full: str, sink: PartSink, start: int, end: int) -> tuple[str, int]:
        """Read bytes [start, end) into the sink; returns the object's ETag and total size (-1: the
        answer was not that range of an object of the sink's size, and nothing was read)."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={start}-{end - 1}")
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) == "InvalidRange":
                return "", -1  # the object is shorter than the size it was expected to have
            raise
        body = resp["Body"]
        total = _total_size(resp.get("ContentRange"), int(resp.get("ContentLength", -1)))
        if total != sink.view.nbytes or int(resp.get("ContentLength", -1)) != end - start:
            body.close()  # another size, or the range was ignored: the caller reads the object whole
            return str(resp.get("ETag", "")), -1
        try:
            _read_into(body, resp.get("ContentEncoding"), sink, start, end, int(self.transfer.io_chunksize))
        except (OSError, http.client.HTTPException) as exc:
            raise Transient(f"reading part {start}-{end - 1} of {full}: {exc or type(exc).__name__}") from exc
        finally:
            body.close()
        return str(resp.get("ETag", "")), total

    def list(self, prefix: str = "") -> dict[str, int]:
        full = self._key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0

        def ls() -> dict[str, int]:
            out: dict[str, int] = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    out[obj["Key"][strip:]] = int(obj["Size"])
            return out

        return self._call(f"list {prefix or '/'}", ls)

    def delete(self, keys: Iterable[str]) -> None:
        todo = [self._key(k) for k in keys]
        for i in range(0, len(todo), 1000):
            batch = todo[i : i + 1000]

            def rm(batch: list[str] = batch) -> None:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
                errors = [e for e in resp.get("Errors", []) if e.get("Code") not in _MISSING]
                if errors:
                    raise Transient(f"{errors[0].get('Key')}: {errors[0].get('Code')} {errors[0].get('Message', '')}")

            self._call("delete", rm)


def _total_size(content_range: str | None, length: int) -> int:
    """The object's size from a ranged answer's `bytes a-b/total` (a whole-object answer: its length)."""
    if content_range and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        return int(tail) if tail.isdigit() else -1
    return length


def _read_into(body: Any, encoding: str | None, sink: PartSink, start: int, end: int, chunk: int) -> None:
    """Fill sink.view[start:end] from a GET's body, reporting each chunk to the sink as it lands.

    botocore's body and urllib3 under it only hand out new bytes objects (urllib3's readinto copies
    from one); http.client's response under them reads from the socket straight into our buffer. It
    is used when the body is a plain, unencoded stream, where its bytes are exactly the object's.
    """
    raw = getattr(body, "_raw_stream", None) if type(body) is StreamingBody else None
    direct = getattr(raw, "_fp", None) if encoding in (None, "", "identity") else None
    chunk = max(chunk, 64 * 1024)
    pos = start
    while pos < end:
        stop = min(end, pos + chunk)
        if direct is not None:
            n = direct.readinto(sink.view[pos:stop])
        else:
            data = body.read(stop - pos)
            n = len(data)
            sink.view[pos : pos + n] = data
        if not n:
            raise http.client.IncompleteRead(b"", end - pos)
        sink.filled(pos, pos + n)
        pos += n
    if raw is not None and direct is not None:
        raw.release_conn()  # every byte is read: the connection goes back to the pool for reuse

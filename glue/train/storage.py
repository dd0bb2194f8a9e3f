"""Checkpoint targets: an S3 prefix (boto3, multipart, parallel parts) or a filesystem directory.

Both expose the same five operations on keys relative to the target root. Nothing here renames:
renames are not atomic on S3 and silently fail on some FUSE mounts, so the commit protocol
(checkpoint.py) relies only on "COMMIT.json is written last". Transient failures are retried
with exponential backoff; permanent ones (missing bucket, rejected credentials) fail at once.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

import boto3
import botocore.session
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.credentials import CredentialProvider, Credentials, RefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from s3transfer.exceptions import RetriesExceededError

from glue.train import s3_errors
from glue.train.errors import ObjectMissingError, StorageError, TargetError

log = logging.getLogger("glue.train")
T = TypeVar("T")

MiB = 1024 * 1024


class CredentialsLike(Protocol):
    """What a credentials callback returns (glue.cloud.base.BucketCredentials fits; read-only is fine)."""

    @property
    def access_key(self) -> str: ...

    @property
    def secret_key(self) -> str: ...

    @property
    def session_token(self) -> str | None: ...

    @property
    def expires_at(self) -> float | None:
        """Epoch seconds; None = does not expire."""
        ...


CredentialsCallback = Callable[[], CredentialsLike]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and by total time."""

    attempts: int = 10
    base_s: float = 0.5
    max_s: float = 15.0
    deadline_s: float = 300.0


class _Transient(Exception):
    """Internal: a failure worth retrying; carries a one-line description."""


class Storage(Protocol):
    """Keys are relative to the target root and use '/' separators."""

    def describe(self) -> str: ...

    def check(self) -> None: ...

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        """The object's bytes and their sha256 (hex), hashed while the bytes arrive."""
        ...

    def list(self, prefix: str = "") -> dict[str, int]:
        """Every object under prefix (recursive): key -> size in bytes."""
        ...

    def delete(self, keys: Iterable[str]) -> None: ...


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    return ts.isoformat(timespec="microseconds").replace("+00:00", "Z")


# Backoff jitter must not draw from the global `random` stream: the training loop owns that one,
# and a draw from this thread would make the run differ from an uninterrupted one.
_jitter = random.Random()


def with_retry(what: str, op: Callable[[], T], policy: RetryPolicy) -> T:
    """Run op; on _Transient, back off and retry until the policy runs out, then StorageError."""
    start = time.monotonic()
    delay = policy.base_s
    for attempt in range(1, policy.attempts + 1):
        try:
            return op()
        except _Transient as exc:
            elapsed = time.monotonic() - start
            if attempt == policy.attempts or elapsed + delay > policy.deadline_s:
                raise StorageError(f"{what} failed after {attempt} attempts over {elapsed:.1f}s: {exc}") from exc
            log.warning("%s failed (attempt %d/%d), retrying in %.1fs: %s", what, attempt, policy.attempts, delay, exc)
            time.sleep(delay * (0.5 + _jitter.random() / 2))
            delay = min(delay * 2, policy.max_s)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# filesystem


class FileStorage:
    """A directory (local disk, or the bucket mounted at /mnt/s3). Writes in place, fsyncs, no renames."""

    def __init__(self, root: Path, retry: RetryPolicy | None = None) -> None:
        self.root = root
        self.retry = retry or RetryPolicy()

    def describe(self) -> str:
        return str(self.root)

    def check(self) -> None:
        # A path under /mnt/s3 that is not mounted would silently land on the VM's ephemeral disk.
        for parent in [self.root, *self.root.parents]:
            if str(parent) == "/mnt/s3" and not os.path.ismount(parent):
                raise TargetError(f"{self.root} is under /mnt/s3 but the bucket is not mounted there")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TargetError(f"cannot create checkpoint directory {self.root}: {exc.strerror}") from exc

    def _path(self, key: str) -> Path:
        return self.root / key

    def _fs(self, what: str, op: Callable[[], T]) -> T:
        def attempt() -> T:
            try:
                return op()
            except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
                raise
            except OSError as exc:
                raise _Transient(f"{exc.strerror or exc}") from exc

        return with_retry(what, attempt, self.retry)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            # The directory entry must be durable before anything that refers to it (COMMIT.json).
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            except OSError:
                pass  # some FUSE filesystems do not support fsync on directories
            finally:
                os.close(dfd)

        try:
            self._fs(f"write {path}", write)
        except PermissionError as exc:
            raise TargetError(f"cannot write {path}: permission denied") from exc

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        path = self._path(key)

        def read() -> tuple[bytearray, str]:
            with open(path, "rb", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                buf = bytearray(size)
                view = memoryview(buf)
                got = 0
                while got < size:
                    n = fh.readinto(view[got:])
                    if not n:
                        break
                    got += n
                del buf[got:]
            return buf, hashlib.sha256(buf).hexdigest()

        try:
            return self._fs(f"read {path}", read)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectMissingError(key) from exc

    def list(self, prefix: str = "") -> dict[str, int]:
        base = self._path(prefix) if prefix else self.root
        out: dict[str, int] = {}

        def walk() -> dict[str, int]:
            out.clear()
            if not base.exists():
                return out
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    full = Path(dirpath) / name
                    try:
                        out[full.relative_to(self.root).as_posix()] = full.stat().st_size
                    except FileNotFoundError:
                        continue  # deleted while we walked
            return out

        return self._fs(f"list {base}", walk)

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)

            def unlink(path: Path = path) -> None:
                path.unlink(missing_ok=True)

            self._fs(f"delete {path}", unlink)
            parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root and self.root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break  # not empty (or already gone): stop climbing
                parent = parent.parent


# ---------------------------------------------------------------------------------------------
# S3

# Codes that no amount of retrying fixes.
_PERMANENT = {
    "NoSuchBucket": "bucket does not exist",
    "AccessDenied": "access denied (credentials lack permission)",
    "InvalidAccessKeyId": "credentials rejected (unknown access key)",
    "SignatureDoesNotMatch": "credentials rejected (wrong secret key)",
    "InvalidBucketName": "invalid bucket name",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}

DEFAULT_TRANSFER = TransferConfig(
    multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=8, use_threads=True
)


class _CallbackProvider(CredentialProvider):
    """Feeds botocore from a callback; RefreshableCredentials calls it again before expiry."""

    METHOD = "gpukit-callback"
    CANONICAL_NAME = "gpukit-callback"

    def __init__(self, callback: CredentialsCallback) -> None:
        super().__init__()
        self._callback = callback

    def _metadata(self) -> dict[str, Any]:
        creds = self._callback()
        expires = creds.expires_at
        if expires is None:
            # Not expiring: refresh daily anyway (cheap) so rotated keys are picked up.
            expires = time.time() + 86400
        return {
            "access_key": creds.access_key,
            "secret_key": creds.secret_key,
            "token": creds.session_token,
            "expiry_time": iso(datetime.fromtimestamp(expires, UTC)),
        }

    def load(self) -> Credentials:
        return RefreshableCredentials.create_from_metadata(
            metadata=self._metadata(), refresh_using=self._metadata, method=self.METHOD
        )


class _HashSink:
    """A write-only (non-seekable) download target: s3transfer then writes parts in order, so the
    sha256 is computed while the download runs instead of in a second pass."""

    def __init__(self, size_hint: int | None) -> None:
        self.buf = bytearray(size_hint or 0)
        self.pos = 0
        self.sha = hashlib.sha256()

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        n = len(data)
        end = self.pos + n
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[self.pos : end] = data
        self.sha.update(data)
        self.pos = end
        return n

    def result(self) -> tuple[bytearray, str]:
        del self.buf[self.pos :]
        return self.buf, self.sha.hexdigest()


class BlobReader(io.RawIOBase):
    """A seekable reader over bytes already in memory, without the copy io.BytesIO(bytearray) makes
    (torch.load of a 500 MB object is about twice as fast this way)."""

    def __init__(self, data: bytes | bytearray) -> None:
        super().__init__()
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        out = self._view[self._pos : end].tobytes()
        self._pos = max(self._pos, end)
        return out


def make_s3_client(
    endpoint_url: str | None = None,
    credentials: CredentialsCallback | None = None,
    region: str | None = None,
    max_pool: int = 16,
    allow_instance_metadata: bool = False,
) -> Any:
    """A boto3 S3 client. Credentials: the callback, else the usual env vars / shared files."""
    bs = botocore.session.get_session()
    resolver = bs.get_component("credential_provider")
    if not allow_instance_metadata:
        # The kit hands credentials over explicitly; never probe link-local metadata services.
        for name in ("iam-role", "container-role"):
            try:
                resolver.remove(name)
            except (KeyError, ValueError):
                pass
    if credentials is not None:
        resolver.insert_before("env", _CallbackProvider(credentials))
    session = boto3.session.Session(
        botocore_session=bs,
        region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    )
    if session.get_credentials() is None:
        raise TargetError(
            "no S3 credentials: pass a credentials callback or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    cfg = Config(
        max_pool_connections=max_pool,
        # No botocore retries: its backoff jitter draws from the global `random` stream (see
        # _jitter); with_retry() retries instead.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"} if endpoint else {},
    )
    return s3_errors.install(session.client("s3", endpoint_url=endpoint, config=cfg))


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
                raise _Transient(f"{code or 'error'}: {err.get('Message', '')}".strip()) from exc
            except NoCredentialsError as exc:
                raise TargetError("no S3 credentials available") from exc
            except (BotoCoreError, Boto3Error, RetriesExceededError) as exc:
                raise _Transient(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc

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

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)

        def up() -> None:
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=self.transfer)

        self._call(f"upload {key}", up)

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        full = self._key(key)

        def down() -> tuple[bytearray, str]:
            sink = _HashSink(size_hint)
            self.client.download_fileobj(self.bucket, full, sink, Config=self.transfer)
            return sink.result()

        return self._call(f"download {key}", down, missing_key=key)

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
                    raise _Transient(f"{errors[0].get('Key')}: {errors[0].get('Code')} {errors[0].get('Message', '')}")

            self._call("delete", rm)


# ---------------------------------------------------------------------------------------------


def open_target(
    target: str | os.PathLike[str],
    *,
    endpoint_url: str | None = None,
    credentials: CredentialsCallback | None = None,
    region: str | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryPolicy | None = None,
    check: bool = True,
) -> Storage:
    """`s3://bucket/prefix`, `file:///path` or a plain path -> a Storage (checked unless check=False)."""
    text = os.fspath(target)
    parsed = urlparse(text)
    storage: Storage
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise TargetError(f"no bucket in checkpoint target {text!r}: use s3://bucket/prefix")
        # two objects move at once (checkpoint.py), each with max_concurrency parts in flight
        max_pool = 2 * int(getattr(transfer or DEFAULT_TRANSFER, "max_concurrency", 10)) + 4
        client = make_s3_client(endpoint_url, credentials, region, max_pool=max_pool)
        storage = S3Storage(parsed.netloc, parsed.path, client, transfer=transfer, retry=retry)
    elif parsed.scheme == "file":
        storage = FileStorage(Path(parsed.path), retry=retry)
    elif parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        storage = FileStorage(Path(text).absolute(), retry=retry)
    else:
        raise TargetError(
            f"unknown checkpoint target scheme {parsed.scheme!r} in {text!r}: use s3://bucket/prefix or a path"
        )
    if check:
        storage.check()
    return storage

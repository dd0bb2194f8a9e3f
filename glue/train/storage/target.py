"""Checkpoint targets: the five operations every target offers, and `open_target`, which picks one.

Keys are relative to the target root. Nothing here renames: renames are not atomic on S3 and
silently fail on some FUSE mounts, so the commit protocol relies only on "COMMIT.json is written
last". Backends: glue.train.storage.folder (a directory), glue.train.storage.s3 (an S3 prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from boto3.s3.transfer import TransferConfig

from glue.train.errors import TargetError
from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.folder import FileStorage
from glue.train.storage.retry import RetryPolicy
from glue.train.storage.s3 import DEFAULT_TRANSFER, S3Storage
from glue.train.storage.s3_client import CredentialsCallback, make_s3_client


class Storage(Protocol):
    """Keys are relative to the target root and use '/' separators."""

    def describe(self) -> str: ...

    def check(self) -> None: ...

    def put(self, key: str, data: bytes | bytearray) -> None: ...

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        """The object's bytes and their sha256 (hex), hashed while the bytes arrive."""
        ...

    def list(self, prefix: str = "") -> dict[str, int]:
        """Every object under prefix (recursive): key -> size in bytes."""
        ...

    def delete(self, keys: Iterable[str]) -> None: ...


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
        # two objects move at once (the commit protocol), each with max_concurrency parts in flight
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


def open_bucket(spec: dict[str, Any]) -> Storage:
    """The bucket's root as a VM-side tool is told it: spec {"bucket": {"name", "endpoint", "region"},
    "credentials_file"} (the launch spec's shape; the workspace step, a spare's arming, a warm process)."""
    bucket, cred_file = spec["bucket"], spec.get("credentials_file")
    return open_target(
        f"s3://{bucket['name']}", endpoint_url=bucket.get("endpoint"), region=bucket.get("region"),
        credentials=(lambda: credentials_from_file(cred_file)) if cred_file else None, check=False,
    )

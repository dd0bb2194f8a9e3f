"""Controller-side access to the persistent bucket (boto3), from terraform's `bucket` output."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.train.storage import s3_errors
from glue.train.storage.mount import MOUNT


def client(info: BucketInfo, creds: BucketCredentials, timeout: float = 10.0, checksums: bool = True) -> Any:
    """checksums=False: no CRC of every body sent or received (a content-addressed upload, whose sha256 the
    VM checks end to end, needs none)."""
    # botocore's default, or only where S3 insists
    when: Literal["when_supported", "when_required"] = "when_supported" if checksums else "when_required"
    return s3_errors.install(boto3.client(
        "s3",
        endpoint_url=info.endpoint,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.session_token,
        region_name=info.signing_region,
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 2},
            request_checksum_calculation=when,
            response_checksum_validation=when,
        ),
    ))


def reachable(info: BucketInfo, creds: BucketCredentials) -> bool:
    """True when the bucket answers an authenticated request."""
    try:
        client(info, creds, timeout=3.0).head_bucket(Bucket=info.name)
        return True
    except (BotoCoreError, ClientError):
        return False


MISSING_CODES = ("NoSuchKey", "404", "NotFound")
# Failures of the body after a good status line: botocore retries requests, not reads of their body.
_BROKEN_BODY = (ResponseStreamingError, FlexibleChecksumError, IncompleteReadError, ReadTimeoutError)


def read(s3: Any, bucket: str, key: str, attempts: int = 5) -> bytes | None:
    """The object's bytes, or None when there is no such key.

    A 5xx or a body that breaks off or fails its checksum is read again (a record being replaced
    while it is read can do that on S3-compatible servers); other errors are raised at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING_CODES:
                return None
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if status < 500 or attempt == attempts:
                raise
        except _BROKEN_BODY:
            if attempt == attempts:
                raise
        time.sleep(0.2 * attempt)  # a loaded server can answer 500 several times in a row while a key is replaced
    raise AssertionError("unreachable")


def read_json(s3: Any, bucket: str, key: str, attempts: int = 3) -> Any:
    """The object parsed as JSON, or None when there is no such key. A body that does not parse is
    read again before ValueError: rclone's local bucket can serve a record torn by a concurrent put."""
    for attempt in range(1, attempts + 1):
        data = read(s3, bucket, key)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            if attempt == attempts:
                raise
            time.sleep(0.1 * attempt)
    raise AssertionError("unreachable")


def as_s3_prefix(location: str, bucket: str) -> str | None:
    """A durable location as `prefix` within the bucket (s3://bucket/p or a path under /mnt/s3)."""
    parsed = urlparse(location)
    if parsed.scheme == "s3":
        return parsed.path.strip("/") if parsed.netloc == bucket else None
    path = Path(parsed.path if parsed.scheme == "file" else location)
    return str(path.relative_to(MOUNT)).strip(".") if path.is_relative_to(MOUNT) else None

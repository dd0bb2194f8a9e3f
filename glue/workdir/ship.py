"""The package into the bucket under its content address, once: a tree already there uploads nothing."""

from __future__ import annotations

import json
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from glue.errors import GlueError
from glue.train.layout import code_index_key, code_key
from glue.workdir.pack import Package

# Multipart above 16 MiB, parts in parallel: a 256 MiB tree moves at the link's speed.
TRANSFER = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)


def _present(s3: Any, bucket: str, key: str, size: int) -> bool:
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return int(head.get("ContentLength", -1)) == size


def upload(s3: Any, bucket: str, pkg: Package) -> bool:
    """Upload the tar and its file index unless the bucket holds them. Returns whether bytes moved."""
    key = code_key(pkg.sha256)
    try:
        if _present(s3, bucket, key, pkg.size):
            return False
        # The index first: the tar is the marker that the package is there.
        s3.put_object(Bucket=bucket, Key=code_index_key(pkg.sha256), Body=json.dumps(pkg.index()).encode())
        s3.upload_file(str(pkg.path), bucket, key, Config=TRANSFER)
    except (ClientError, BotoCoreError) as exc:
        raise GlueError(f"bucket {bucket} did not take the code package ({key}): {str(exc).splitlines()[0]}") from exc
    return True

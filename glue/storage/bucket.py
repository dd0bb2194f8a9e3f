"""Controller-side access to the persistent bucket (boto3), from terraform's `bucket` output."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from glue.cloud.base import BucketCredentials, BucketInfo


def client(info: BucketInfo, creds: BucketCredentials, timeout: float = 10.0) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=info.endpoint,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.session_token,
        # rclone and MinIO accept any SigV4 region; AWS needs the real one.
        region_name=info.region if info.region not in ("", "local") else "us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 2},
        ),
    )


def reachable(info: BucketInfo, creds: BucketCredentials) -> bool:
    """True when the bucket answers an authenticated request."""
    try:
        client(info, creds, timeout=3.0).head_bucket(Bucket=info.name)
        return True
    except (BotoCoreError, ClientError):
        return False

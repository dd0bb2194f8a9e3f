"""The boto3 S3 client the trainer uses: credentials from a callback, no instance-metadata probing.

Credentials come from a callback (refreshed by botocore before they expire) or the usual AWS_*
variables. botocore's own retries are off: its backoff jitter draws from the global `random`
stream, which the training loop owns; glue.train.storage.retry retries instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import CredentialProvider, Credentials, RefreshableCredentials

from glue.train.errors import TargetError
from glue.train.storage import s3_errors
from glue.train.storage.region import DEFAULT_REGION
from glue.train.utc import UTC, iso


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
        region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
    )
    if session.get_credentials() is None:
        raise TargetError(
            "no S3 credentials: pass a credentials callback or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    cfg = Config(
        max_pool_connections=max_pool,
        # No botocore retries: its backoff jitter draws from the global `random` stream (see
        # glue.train.storage.retry); with_retry() retries instead.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        # Every object is hashed (sha256) as it is written, read back and compared before COMMIT.json
        # lists it, and every read is hashed and compared again. botocore's own per-request hashes
        # (a CRC32 of each body, and over plain http a SigV4 sha256 of each upload) would check the
        # same bytes again, at about 1.4 s of CPU per GB uploaded; TLS guards the wire on https.
        # Not validating response checksums also spares the HEAD before each download (s3transfer
        # takes the size from the first part) and a false alarm: rclone sends a whole object's
        # CRC32 with a ranged GET of it, which botocore then checks against the part.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"payload_signing_enabled": False, **({"addressing_style": "path"} if endpoint else {})},
    )
    return s3_errors.install(session.client("s3", endpoint_url=endpoint, config=cfg))

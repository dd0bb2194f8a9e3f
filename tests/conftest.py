"""Shared fixtures: a real rclone S3 server on loopback, in a throwaway GPUKIT_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from glue.cloud.local.bucket import LocalBucket
from glue.paths import PROJECT_ROOT
from glue.records import BucketCredentials, BucketInfo

# Every test's kit home is fresh, but they share one image cache per clone: the image is baked once
# (`glue image build`, minutes), then reused while its recipe is unchanged.
os.environ.setdefault("GPUKIT_IMAGES", str(PROJECT_ROOT / ".gpukit" / "images"))


@dataclass
class BucketHandle:
    server: LocalBucket
    info: BucketInfo
    creds: BucketCredentials

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.info.endpoint,
            aws_access_key_id=self.creds.access_key,
            aws_secret_access_key=self.creds.secret_key,
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def local_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BucketHandle]:
    """A running `rclone serve s3` with bucket `gpukit`; stopped at the end of the session."""
    server = LocalBucket(Path(tmp_path_factory.mktemp("bucket-home")))
    info = server.ensure_running()
    yield BucketHandle(server=server, info=info, creds=server.credentials())
    server.stop()


# One registration of the kit fixtures for the whole tree, so integration and e2e share one cluster.
from tests.kit import cluster_kit, kit  # noqa: E402

__all__ = ["BucketHandle", "cluster_kit", "kit", "local_bucket"]

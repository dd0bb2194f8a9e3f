"""Shared fixtures: a real rclone S3 server on loopback, in a throwaway GPUKIT_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from xdist.scheduler import LoadScopeScheduling

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


# `make test` runs two lanes on two pytest-xdist workers (-n 2 --lanes): the files here, minutes of
# emulation each, on one; every other test, in order, on the other. Two workers sharing the
# local-VM tests would starve the timing-sensitive ones (stall detection, the 2-node group) on a
# 2-core machine; the qemu lane yields the CPU instead (test_qemu.py renices its worker).
OWN_LANE = ("tests/integration/test_qemu.py",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lanes", action="store_true", default=False,
                     help="with -n 2: the qemu e2e on one worker, the rest of the suite in order on the other")


class Lanes(LoadScopeScheduling):
    """xdist's scope scheduling with two scopes: a file of OWN_LANE, or the serial lane."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return path if path in OWN_LANE else "serial"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Lanes | None:
    return Lanes(config, log) if config.getoption("lanes") else None


# One registration of the kit fixtures for the whole tree, so integration and e2e share one cluster.
from tests.kit import cluster_kit, kit  # noqa: E402

__all__ = ["BucketHandle", "cluster_kit", "kit", "local_bucket"]


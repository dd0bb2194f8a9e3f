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

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.local.bucket import LocalBucket
from glue.paths import PROJECT_ROOT
from tests import lanes

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lanes", action="store_true", default=False,
                     help=f"with -n {len(lanes.LANES)}: one worker per lane (tests/lanes.py), each lane's files in "
                          "order; every lane but the serial one reniced")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --lanes, the unit tests first (a stable sort: every other test keeps its order)."""
    if config.getoption("lanes"):
        items.sort(key=lambda item: 0 if item.nodeid.startswith(lanes.SIDE_DIRS) else 1)


class Lanes(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per lane (tests/lanes.py): each lane's tests on one worker, in
    order."""

    def _split_scope(self, nodeid: str) -> str:
        return lanes.lane_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Lanes | None:
    return Lanes(config, log) if config.getoption("lanes") else None


_LANE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each lane's test time (setup, call, teardown): the lane that ends last is the suite's wall time."""
    lane = lanes.lane_of(report.nodeid)
    _LANE_SECONDS[lane] = _LANE_SECONDS.get(lane, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("lanes") and _LANE_SECONDS:
        terminalreporter.write_line("lanes (seconds of tests): " + ", ".join(
            f"{lane} {_LANE_SECONDS[lane]:.0f}" for lane in lanes.LANES if lane in _LANE_SECONDS))


@pytest.fixture(autouse=True)
def _other_lanes_yield_the_cpu(request: pytest.FixtureRequest) -> None:
    """Renice this worker (and what it starts: torch, qemu, VMs) before its first test outside the serial lane;
    for good: the worker's lane is decided once."""
    if (request.config.getoption("lanes") and os.environ.get("PYTEST_XDIST_WORKER")
            and lanes.lane_of(request.node.nodeid) != "serial"):
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if now < lanes.NICE:
            os.nice(lanes.NICE - now)


# One registration of the kit fixtures for the whole tree, so integration and e2e share one cluster.
from tests.kit import cluster_kit, kit, oom_run  # noqa: E402

__all__ = ["BucketHandle", "cluster_kit", "kit", "local_bucket", "oom_run"]

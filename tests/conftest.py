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


# `make test` runs two lanes on two pytest-xdist workers (-n 2 --lanes). Most of the suite's time is
# waiting on VMs (its CPU time is about a third of two cores' wall time), so lanes overlap the waits.
# The serial lane: every test not listed below, in order, at normal priority: the timing-sensitive
# ones (stall detection, the 2-node group) must not be starved on a 2-core machine. The side lane's two
# sets are long and CPU-bound tests with no timing to miss, on one worker, reniced (and what it starts:
# torch, qemu, the VMs), so it takes only the CPU the serial lane leaves:
# - SIDE_LANE: the qemu e2e (minutes of emulation), the checkpoint library, the unit tests;
# - OWN_VMS_LANE: tests with local VMs or clusters of their own (no step timing; waits bounded by
#   deadlines of minutes): Ansible, the cluster's lifecycle, Lyceum's emulator, Slurm. (memprobe's own-job
#   e2e uses the session's cluster: in the serial lane it takes no second 2-VM cluster of its own.)
# (2026-12-06, two lanes under other work's load: side 2323 s of tests, serial 1854 s; then memprobe's
# e2e moved to serial.)
SIDE_LANE = frozenset({
    "tests/integration/test_qemu.py",
    "tests/integration/test_qemu_seed.py",  # `stress`: only in `make test-all`
    "tests/integration/test_ckpt_kill.py",
    "tests/integration/test_ckpt_workers.py",
    # The checkpoint library against a local S3 server: no VMs, no step timing.
    "tests/integration/test_ckpt_s3.py",
    "tests/integration/test_ckpt_resume.py",
    "tests/integration/test_ckpt_transfer.py",
    "tests/integration/test_ckpt_ddp.py",
    "tests/integration/test_ckpt_mount.py",
    "tests/integration/test_restore_pipeline.py",
    "tests/integration/test_bucket_reads.py",
    "tests/integration/test_controller_install.py",  # a wheel into a fresh venv, offline: no VMs
    # Sharded checkpoints (ranks on gloo, kill -9 at hold points) and the framework integrations: CPU-bound
    # library tests, no VM, no timing.
    "tests/integration/test_ckpt_sharded.py",
    "tests/integration/test_ckpt_sharded_kill.py",
    "tests/integration/test_hf_trainer.py",
    "tests/integration/test_lightning_trainer.py",
})
OWN_VMS_LANE = frozenset({
    "tests/integration/test_ansible.py",
    "tests/integration/test_cluster.py",
    "tests/integration/test_doctor.py",
    "tests/integration/test_image_build.py",
    "tests/integration/test_lyceum_e2e.py",
    "tests/integration/test_lyceum_users.py",
    "tests/integration/test_lyceum_spot.py",
    "tests/integration/test_lyceum_refresh.py",  # expiry made by the emulator, not waited for on the clock
    "tests/integration/test_keep_group.py",
    "tests/integration/test_machines.py",
    "tests/integration/test_provider.py",
    "tests/integration/test_up_converge.py",
    "tests/integration/test_config_seed.py",
    # Slurm clusters of their own: jobs wait on Slurm's states under deadlines of minutes.
    "tests/integration/test_slurm_cluster.py",
    "tests/e2e/test_slurm_runs.py",
    "tests/e2e/test_slurm_head.py",
    # Machines of their own, started outside gpukit (the ssh backend's hosts).
    "tests/e2e/test_ssh_hosts.py",
    "tests/e2e/test_user_module.py",
})
# The unit tests too (no VMs), first: they run while the serial lane's first test bakes the VM image
# (a minute from a fresh clone), which every other test of every lane waits for.
SIDE_LANE_DIRS = ("tests/unit/",)
SIDE_LANE_NICE = 10


def _lane(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in SIDE_LANE or path.startswith(SIDE_LANE_DIRS):
        return "side"
    # One reniced side worker for both sets: a third worker (-n 3) saved ~4 % (1815-1887 s against ~1950 s)
    # because the suite is CPU-bound on 2 cores (vmstat: ~90 % busy), and it once starved the serial lane's
    # 2-process group into a false `stall` (since ruled out: tests' runs get a 180 s stall timeout).
    return "side" if path in OWN_VMS_LANE else "serial"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lanes", action="store_true", default=False,
                     help="with -n 2: the side lane (the qemu e2e, the checkpoint library, the unit tests, the "
                          "tests with VMs of their own) on one worker, reniced; the rest of the suite in order on "
                          "the other")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --lanes, the unit tests first (a stable sort: every other test keeps its order)."""
    if config.getoption("lanes"):
        items.sort(key=lambda item: 0 if item.nodeid.startswith(SIDE_LANE_DIRS) else 1)


class Lanes(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per lane (side, own-vms, serial): each lane's tests on one
    worker, in order."""

    def _split_scope(self, nodeid: str) -> str:
        return _lane(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Lanes | None:
    return Lanes(config, log) if config.getoption("lanes") else None


@pytest.fixture(autouse=True)
def _side_lane_yields_the_cpu(request: pytest.FixtureRequest) -> None:
    """Renice this worker (and what it starts: torch, qemu) before its first side-lane test; for good:
    the worker's lane is decided once."""
    if (request.config.getoption("lanes") and os.environ.get("PYTEST_XDIST_WORKER")
            and _lane(request.node.nodeid) != "serial"):
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if now < SIDE_LANE_NICE:
            os.nice(SIDE_LANE_NICE - now)


# One registration of the kit fixtures for the whole tree, so integration and e2e share one cluster.
from tests.kit import cluster_kit, kit, oom_run  # noqa: E402

__all__ = ["BucketHandle", "cluster_kit", "kit", "local_bucket", "oom_run"]

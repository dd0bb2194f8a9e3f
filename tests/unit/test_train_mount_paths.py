"""Targets under the bucket mount: through the S3 API on a VM; through the mount in a serverless run
(GPUKIT_BUCKET_VIA=mount, no S3 API there)."""

from __future__ import annotations

from glue.train import layout
from glue.train.storage.mount import bucket_url, mount_path

RUN = layout.RUNS_PREFIX + "r1"  # a run's records, the conventional target


def test_a_mount_path_is_written_through_the_s3_api_on_a_vm() -> None:
    assert bucket_url(f"/mnt/s3/{RUN}", "gpukit") == f"s3://gpukit/{RUN}"
    assert bucket_url("/mnt/s3", "gpukit") == "s3://gpukit"
    assert bucket_url("/mnt/s3x/runs", "gpukit") is None and bucket_url("s3://gpukit/a", "gpukit") is None


def test_an_s3_target_of_the_bucket_is_the_mount_in_a_serverless_run() -> None:
    assert mount_path(f"s3://gpukit/{RUN}", "gpukit") == f"/mnt/s3/{RUN}"
    assert mount_path(f"s3://gpukit/{RUN}/", "gpukit") == f"/mnt/s3/{RUN}"
    assert mount_path("s3://gpukit", "gpukit") == "/mnt/s3"
    assert mount_path(f"/mnt/s3/{RUN}", "gpukit") == f"/mnt/s3/{RUN}"  # a mount path already
    # Another bucket (or one whose name only starts the same) is not behind this mount: left as it is.
    assert mount_path(f"s3://gpukit2/{RUN}", "gpukit") == f"s3://gpukit2/{RUN}"
    assert mount_path("s3://other/x", "gpukit", "/data") == "s3://other/x"
    assert mount_path("s3://gpukit/x", "gpukit", "/data") == "/data/x"

"""The own-bucket options `glue up` and `glue doctor` share (docs/guides/own-bucket.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from glue.operations.own_bucket import Asked

F = TypeVar("F", bound=Callable[..., Any])


def bucket_options(kit_bucket: bool) -> Callable[[F], F]:
    """--bucket-endpoint, --bucket, --bucket-region, --bucket-profile (and, for `glue up`, --kit-bucket)."""

    def decorate(f: F) -> F:
        if kit_bucket:
            f = click.option("--kit-bucket", is_flag=True,
                             help="Go back to the backend's own bucket (your bucket and its data are untouched); "
                                  "only with no VMs up.")(f)
        f = click.option("--bucket-profile", default=None, metavar="NAME",
                         help="The AWS profile whose credentials the bucket takes (default: the environment's "
                              "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, else AWS_PROFILE).")(f)
        f = click.option("--bucket-region", default=None, metavar="REGION",
                         help="Your bucket's region (AWS: the bucket's, e.g. eu-central-1; R2: auto); default: "
                              "us-east-1 for signing.")(f)
        f = click.option("--bucket", "bucket_name", default=None, metavar="NAME",
                         help="Your own S3-compatible bucket's name (with --bucket-endpoint); it is probed before "
                              "anything is configured.")(f)
        f = click.option("--bucket-endpoint", default=None, metavar="URL",
                         help="Your own S3-compatible bucket's endpoint (AWS S3, R2, MinIO, GCS's S3 API), e.g. "
                              "https://s3.eu-central-1.amazonaws.com; default: as last time, else the backend's "
                              "bucket.")(f)
        return f

    return decorate


def asked(bucket_endpoint: str | None, bucket_name: str | None, bucket_region: str | None,
          bucket_profile: str | None, kit_bucket: bool = False) -> Asked:
    return Asked(endpoint=bucket_endpoint, name=bucket_name, region=bucket_region, profile=bucket_profile,
                 kit_bucket=kit_bucket)

"""The bucket as the workspace step sees it: the bucket's root, through the VM's credentials file."""

from __future__ import annotations

from typing import Any

from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.target import Storage, open_target


def open_bucket(spec: dict[str, Any]) -> Storage:
    """spec: {"bucket": {"name", "endpoint", "region"}, "credentials_file"} (the launch spec's shape)."""
    bucket, cred_file = spec["bucket"], spec.get("credentials_file")
    return open_target(
        f"s3://{bucket['name']}", endpoint_url=bucket.get("endpoint"), region=bucket.get("region"),
        credentials=(lambda: credentials_from_file(cred_file)) if cred_file else None, check=False,
    )

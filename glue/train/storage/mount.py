"""A deployed run's targets under the bucket mount are written through the S3 API instead.

rclone's mount acknowledges a write once it is in the VM's write cache and uploads it seconds
later. A checkpoint committed, verified and pruned through the mount is therefore judged by the
cache, not the bucket: a VM lost in that window loses the new checkpoint after prune has already
removed the older ones. The mount maps `/mnt/s3/<key>` to `s3://<bucket>/<key>`, so the same
target is reached directly through the S3 API, where a successful PUT is durable.

Where the trainer has no S3 API, only the platform's mount (a serverless run: Lyceum mounts the
account's bucket at /mnt/s3 and hands out no keys), GPUKIT_BUCKET_VIA=mount turns this around: every
`s3://<bucket>/<key>` target is written through `/mnt/s3/<key>`, and how durable a closed file is
depends on that platform's mount.
"""

from __future__ import annotations

import os

from glue.train import trainer_vars

MOUNT = "/mnt/s3"
VIA_ENV = trainer_vars.BUCKET_VIA  # "mount": the bucket only through MOUNT (no S3 API where the trainer runs)


def bucket_url(target: str, bucket: str, mount: str = MOUNT) -> str | None:
    """`s3://<bucket>/<key prefix>` for a path under the bucket mount; None for anything else."""
    if "://" in target:
        return None
    path, root = os.path.normpath(os.path.abspath(target)), os.path.normpath(mount)
    if path == root:
        return f"s3://{bucket}"
    if not path.startswith(root + os.sep):
        return None
    return f"s3://{bucket}/{path[len(root) + 1 :]}"


def mount_path(target: str, bucket: str, mount: str = MOUNT) -> str:
    """`<mount>/<key>` for `s3://<bucket>/<key>`; any other target (a path, another bucket) unchanged."""
    prefix = f"s3://{bucket}"
    if target == prefix or target.startswith(prefix + "/"):
        return os.path.join(mount, target[len(prefix):].lstrip("/")).rstrip("/") or mount
    return target

"""A standalone Checkpointer under the bucket mount reaches the bucket through the S3 API as well.

A deployed run gets the bucket's name, endpoint and credentials from its RunContext (glue.train.storage.mount
says why the mount's write cache must not judge a commit). Code that just opens
`Checkpointer("/mnt/s3/...")` has none of that, but the VM does: the bucket_mount role leaves its
settings in /etc/gpukit/mount.conf (shell KEY=value, no secrets) pointing at the rclone config that
holds the endpoint and the credentials (0600, root only; rewritten in place when they are refreshed).
Anyone who cannot read them (not root, or no kit mount on this machine) keeps the mount path.
"""

from __future__ import annotations

import configparser
import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from glue.train.storage.credentials import FileCredentials
from glue.train.storage.mount import bucket_url
from glue.train.storage.s3_client import CredentialsCallback

log = logging.getLogger("glue.train")

SETTINGS = "/etc/gpukit/mount.conf"  # the bucket_mount role's bucket_mount_settings
REREAD_S = 60.0  # credentials are read again at least this often (the controller refreshes them in place)


@dataclass(frozen=True)
class MountedBucket:
    """What the VM's kit mount says about the bucket behind it."""

    mount: str
    bucket: str
    endpoint: str | None
    region: str | None
    rclone_config: Path
    remote: str

    def credentials(self) -> FileCredentials:
        """Read each call: a refresh rewrites the file. Temporary (session) credentials are given a short
        expiry so the S3 client asks again soon; long-lived keys are re-read daily."""
        section = _section(self.rclone_config, self.remote)
        token = section.get("session_token") or None
        expires = time.time() + REREAD_S if token else None
        return FileCredentials(section.get("access_key_id", ""), section.get("secret_access_key", ""), token,
                                 expires)


def _settings(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        words = shlex.split(value)
        out[key.strip()] = words[0] if words else ""
    return out


def _section(rclone_config: Path, remote: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(rclone_config.read_text())
    return parser[remote]


def mounted_bucket(settings: str | None = None) -> MountedBucket | None:
    """The kit mount's bucket, or None when this machine has none we may read."""
    path = Path(settings or os.environ.get("GPUKIT_MOUNT_CONFIG") or SETTINGS)
    try:
        conf = _settings(path)
        remote, _, bucket = conf["REMOTE"].partition(":")
        rclone_config = Path(conf["RCLONE_CONFIG"])
        section = _section(rclone_config, remote)
    except (OSError, KeyError, ValueError, configparser.Error):
        return None
    if not bucket or section.get("type") != "s3":
        return None
    return MountedBucket(conf.get("MNT") or "/mnt/s3", bucket, section.get("endpoint") or None,
                         section.get("region") or None, rclone_config, remote)


def resolve(target: str, region: str | None) -> tuple[str, str | None, CredentialsCallback | None, str | None]:
    """(target, endpoint, credentials, region) to open: the S3 URL behind the kit mount, else as given."""
    via_s3 = direct(target)
    if via_s3 is not None:
        url, mb = via_s3
        return url, mb.endpoint, mb.credentials, region or mb.region
    if bucket_url(target, "any") is not None:
        log.warning("%s is under /mnt/s3 but the mount's settings are not readable here: checkpoints are judged "
                    "by the mount's write cache; prefer an s3:// target", target)
    return target, None, None, region


def direct(target: str) -> tuple[str, MountedBucket] | None:
    """(`s3://bucket/key prefix`, the mount) for a path under the kit's bucket mount; None otherwise."""
    if "://" in target:
        return None
    mb = mounted_bucket()
    if mb is None:
        return None
    url = bucket_url(target, mb.bucket, mb.mount)
    if url is None:
        return None
    log.info("%s is under the bucket mount: written through the S3 API as %s", target, url)
    return url, mb

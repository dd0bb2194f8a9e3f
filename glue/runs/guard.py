"""The ephemeral-disk boundary guard: every durable location must be in the bucket.

A location is accepted when it is `s3://<the cluster's bucket>/...`, or a path under a LIVE bucket
mount on the VM through which a probe object really reaches the bucket. A path on the VM's own
disk is refused, naming it and why: that disk is wiped when the VM terminates.
"""

from __future__ import annotations

import shlex
import time
import uuid
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from botocore.exceptions import BotoCoreError, ClientError

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store

MOUNT = PurePosixPath("/mnt/s3")
MOUNT_FSTYPE = "fuse.rclone"
MOUNT_UNIT = "gpukit-mount.service"  # bucket_mount's unit (bucket_mount_service_name)
PROBE_TIMEOUT = 20.0


def _findmnt(home: Path, host: Host, path: PurePosixPath) -> tuple[str, str]:
    """(mount target, fstype) of the filesystem that holds `path` (or its nearest existing parent)."""
    script = (
        f"p={shlex.quote(str(path))}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
        "findmnt -n -o TARGET,FSTYPE --target \"$p\""
    )
    res = ssh.run(home, host, script, timeout=20)
    parts = res.stdout.split()
    if res.exit_code != 0 or len(parts) < 2:
        raise GlueError(f"{host.name}: cannot tell which filesystem holds {path}: {res.stderr.strip()}")
    return parts[0], parts[1]


# A FUSE mount whose daemon died stays in the mount table but every stat fails (ENOTCONN, EIO).
_MOUNT_STATE = (f"findmnt -n -o FSTYPE --mountpoint {MOUNT} >/dev/null 2>&1 || {{ echo absent; exit 0; }}; "
                f"if err=$(stat -t {MOUNT} 2>&1 >/dev/null); then echo live; else echo \"dead $err\"; fi")


def mount_state(home: Path, host: Host) -> tuple[str, str]:
    """("live" | "dead" | "absent", detail) of the bucket mount at /mnt/s3 on the VM."""
    res = ssh.run(home, host, _MOUNT_STATE, timeout=20)
    state, _, detail = res.stdout.strip().partition(" ")
    return state or "absent", detail.split(": ")[-1] if detail else ""


def mount_restarted_since(home: Path, host: Host, since_epoch: float) -> str | None:
    """When the VM's bucket mount unit was (re)started by systemd after `since_epoch` (its rclone died and
    the unit brought it back), say so; None otherwise (no restart, or no such unit: a daemon-managed mount)."""
    script = (f"n=$(systemctl show -p NRestarts --value {MOUNT_UNIT} 2>/dev/null); "
              f"t=$(systemctl show -p ActiveEnterTimestamp --value {MOUNT_UNIT} 2>/dev/null); "
              "echo \"${n:-0} $(date -d \"$t\" +%s 2>/dev/null || echo 0)\"")
    res = ssh.run(home, host, script, timeout=20)
    try:
        restarts, at = (int(x) for x in res.stdout.split()[:2])
    except ValueError:
        return None
    if restarts > 0 and at > since_epoch:
        return (f"the bucket mount at {MOUNT} on {host.name} restarted during the attempt (its rclone died; "
                f"{restarts} restart(s) of {MOUNT_UNIT})")
    return None


def check_location(home: Path, host: Host, store: RunStore, what: str, location: str) -> None:
    parsed = urlparse(location)
    if parsed.scheme == "s3":
        if parsed.netloc != store.info.name:
            raise GlueError(f"{what} {location} is not in the cluster's bucket {store.info.name!r}; "
                            f"use s3://{store.info.name}/...")
        store.keys("")  # the bucket answers (raises a one-line error otherwise)
        return
    if parsed.scheme not in ("", "file"):
        raise GlueError(f"{what} {location}: unknown scheme {parsed.scheme!r}; use s3://bucket/prefix or a path "
                        f"under {MOUNT}")
    path = PurePosixPath(parsed.path if parsed.scheme == "file" else location)
    if not path.is_absolute():
        raise GlueError(f"{what} {location} must be an absolute path under {MOUNT} or an s3:// URL")
    if path.is_relative_to(MOUNT):
        state, detail = mount_state(home, host)
        if state == "dead":
            raise GlueError(f"{what} {path}: the bucket mount at {MOUNT} on {host.name} is dead ({detail}: its "
                            "rclone process is gone); `glue up` remounts it, and `glue recover` moves a failed run "
                            "onto a VM with a live mount")
    target, fstype = _findmnt(home, host, path)
    if not path.is_relative_to(MOUNT):
        raise GlueError(f"{what} {path} is on the VM's own disk ({fstype} at {target}), which is wiped when the VM "
                        f"terminates; use s3://{store.info.name}/... or a path under {MOUNT}")
    if target != str(MOUNT) or fstype != MOUNT_FSTYPE:
        raise GlueError(f"{what} {path}: {MOUNT} on {host.name} is a plain directory on the VM's own disk, not a "
                        f"live bucket mount ({fstype} at {target}); writes there would be lost. Re-run the playbook "
                        "with `glue up`")
    _probe(home, host, store, what, path)


def _probe(home: Path, host: Host, store: RunStore, what: str, path: PurePosixPath) -> None:
    """Write through the mount; the object must appear in the bucket via the S3 API."""
    name = f".gpukit-probe-{uuid.uuid4().hex[:12]}"
    probe = path / name
    body = uuid.uuid4().hex
    res = ssh.run(home, host, f"mkdir -p {shlex.quote(str(path))} && printf %s {body} > {shlex.quote(str(probe))}",
                  timeout=30)
    if res.exit_code != 0:
        raise GlueError(f"{what} {path}: cannot write through the bucket mount on {host.name}: {res.stderr.strip()}")
    key = str(probe.relative_to(MOUNT))
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        while time.monotonic() < deadline:
            try:
                got = bucket_store.read(store.s3, store.info.name, key)
            except (ClientError, BotoCoreError) as exc:
                raise GlueError(f"{what} {path}: the bucket did not answer while checking the mount probe: "
                                f"{str(exc).splitlines()[0]}; check `glue status`") from exc
            if got == body.encode():
                return
            time.sleep(0.5)
        raise GlueError(f"{what} {path}: a probe written through {MOUNT} on {host.name} did not reach the bucket "
                        f"within {PROBE_TIMEOUT:.0f}s; the mount is not delivering writes (check `glue status`)")
    finally:
        ssh.run(home, host, f"rm -f {shlex.quote(str(probe))}", timeout=20)

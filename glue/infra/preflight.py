"""Checks `glue up` makes before creating anything: each failure is one line naming the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from glue.errors import GlueError

SSHD = Path("/usr/sbin/sshd")


def check_local_backend() -> None:
    if not SSHD.exists():
        raise GlueError("sshd is missing (Debian package openssh-server); run `make bootstrap` or "
                        "`apt-get install openssh-server`")
    if shutil.which("fusermount3") is None or not Path("/dev/fuse").exists():
        raise GlueError("FUSE is missing (Debian package fuse3 and /dev/fuse); run `make bootstrap` or "
                        "`apt-get install fuse3`")
    if shutil.which("unshare") is None:
        raise GlueError("unshare is missing (Debian package util-linux); run `apt-get install util-linux`")
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--pid", "--fork", "true"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )
    if probe.returncode != 0:
        raise GlueError(
            "cannot create mount/UTS/PID namespaces here (the local backend's VMs need them); "
            "run as root (e.g. `sudo make up`) or enable unprivileged user namespaces"
        )


def check_terraform() -> None:
    if shutil.which("terraform") is None:
        raise GlueError("terraform is not on PATH; install Terraform >= 1.5 and run the command again")


def check(backend: str) -> None:
    check_terraform()
    if backend == "local":
        check_local_backend()
    if backend == "qemu":
        from glue.cloud.qemu import vm

        vm.check_tools()

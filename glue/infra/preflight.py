"""Checks `glue up` makes before creating anything: each failure is one line naming the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from glue.errors import GlueError

FUSE = Path("/dev/fuse")


def check_local_backend() -> None:
    """The local VMs are systemd-nspawn machines in their own mount namespace, with /dev/fuse bound in."""
    from glue.cloud.local import nspawn

    nspawn.check_tools()
    if not FUSE.exists():
        raise GlueError("/dev/fuse is missing (the VMs mount the bucket with FUSE); run `make bootstrap` or "
                        "`apt-get install fuse3`, and load the fuse module (`modprobe fuse`)")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False,
                           stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        raise GlueError("cannot create a mount namespace here (the local backend's VMs need one); "
                        "run as root (e.g. `sudo make up`)")


def check_terraform() -> None:
    if shutil.which("terraform") is None:
        raise GlueError("terraform is not on PATH; install Terraform >= 1.5 and run the command again")


def check(backend: str) -> None:
    check_terraform()
    if backend == "local":
        check_local_backend()
    if backend == "qemu":
        from glue.cloud.qemu import vm
        from glue.images import docker_seed

        vm.check_tools()
        docker_seed.check_tools()  # the boot disk's Docker base is imported in a systemd-nspawn container

"""What this machine needs for the local backend's VMs: systemd-nspawn machines in their own mount
namespace, with /dev/fuse bound in (the VMs mount the bucket with FUSE)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from glue.cloud.local import nspawn
from glue.errors import GlueError

FUSE = Path("/dev/fuse")


def check() -> None:
    nspawn.check_tools()
    if not FUSE.exists():
        raise GlueError("/dev/fuse is missing (the VMs mount the bucket with FUSE); run `make bootstrap` or "
                        "`apt-get install fuse3`, and load the fuse module (`modprobe fuse`)")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False,
                           stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        raise GlueError("cannot create a mount namespace here (the local backend's VMs need one); "
                        "run as root (e.g. `sudo make up`)")

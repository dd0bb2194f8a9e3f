"""Checks `glue up` makes before creating anything, beyond the backend's own (`Backend.check_host`):
each failure is one line naming the fix."""

from __future__ import annotations

import shutil

from glue.errors import GlueError


def check_terraform() -> None:
    if shutil.which("terraform") is None:
        raise GlueError("terraform is not on PATH; install Terraform >= 1.5 and run the command again")

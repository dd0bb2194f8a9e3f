"""The user's repository around the workdir (not gpukit's): commit, dirty flag, uncommitted diff hash."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any


def _git(cwd: Path, *args: str) -> bytes | None:
    try:
        out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def repo_info(workdir: Path) -> dict[str, Any]:
    """{repository, commit, dirty, diff_sha256}; all None outside a git repository."""
    top = _git(workdir, "rev-parse", "--show-toplevel")
    if top is None:
        return {"repository": None, "commit": None, "dirty": None, "diff_sha256": None}
    commit = _git(workdir, "rev-parse", "--verify", "-q", "HEAD")
    status = _git(workdir, "status", "--porcelain")
    diff = _git(workdir, "diff", "HEAD", "--binary") if commit else None
    return {
        "repository": top.decode().strip(),
        "commit": commit.decode().strip() if commit else None,
        "dirty": bool(status.strip()) if status is not None else None,
        "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None,
    }

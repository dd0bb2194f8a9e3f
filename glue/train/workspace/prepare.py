"""Every attempt, on every node, before the trainer starts: the code and the virtualenv, both checked.

Nothing comes from the controller's folder or a package index: the package and the wheels are read
from the bucket by the hashes in the run's manifest.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from glue.train.storage.target import Storage
from glue.train.workspace import envbuild, environment, package, venv
from glue.train.workspace.paths import MEMORY_ROOT, WorkPaths

SET_MARKER = venv.MARKER


def ensure_venv(storage: Storage, paths: WorkPaths, req: dict[str, Any]) -> Path:
    """The run's venv for the set from the wheelhouse alone (reused when one checked earlier is still
    there), never from a pack. Returns its python."""
    digest = str(req["set_sha256"])
    if not venv.is_ready(paths.env_dir(digest), digest, list(req["pins"])):
        envbuild.from_wheelhouse(storage, paths, req)
    return envbuild.link(paths, digest)


def prepare(storage: Storage, spec: dict[str, Any], root: Path | None = None,
            memory: Path | None = None) -> dict[str, Any]:
    """spec: run, attempt, package ({sha256, size} or None), requirements ({set_sha256, pins, wheels} or
    None). Returns where the trainer runs: {python, code_dir, package_sha256, requirements_set} and, with
    requirements, how their environment came to be (environment: glue.train.workspace.environment).
    root: the work folder (a test's); memory: where environments may go in memory (a VM's: /dev/shm)."""
    paths = (WorkPaths(str(spec["run"]), int(spec["attempt"]), root, memory) if root
             else WorkPaths(str(spec["run"]), int(spec["attempt"]), memory=MEMORY_ROOT))
    paths.attempt_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"python": sys.executable, "code_dir": None, "package_sha256": None,
                           "requirements_set": None}
    if spec.get("package"):
        rec = package.prepare(storage, paths, spec["package"])
        out.update(code_dir=rec["code_dir"], package_sha256=rec["sha256"])
    req = spec.get("requirements")
    if req and req.get("pins"):
        python, how = environment.ready(storage, paths, req)
        out.update(python=str(python), requirements_set=req["set_sha256"], environment=how)
    return out

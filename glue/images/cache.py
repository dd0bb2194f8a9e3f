"""The image cache: <cache>/<name>-<hash16>/{rootfs/, image.json}, one directory per recipe hash.

A directory appears only by an atomic rename of a finished build, so whatever is in the cache is
complete; builds in progress live in `.build-*` directories, removed when the build fails.
The cache is the machine's (`$XDG_CACHE_HOME/gpukit/images`, else `~/.cache/gpukit/images`): an image
is named by its recipe's hash, so every clone and kit home of this user shares what was baked once, as
Docker's image store does; $GPUKIT_IMAGES chooses another (the test suite uses one per clone).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from glue.errors import GlueError
from glue.images.recipe import Recipe
from glue.paths import state_dir_error

META = "image.json"


def machine_cache() -> Path:
    """The default cache: this user's, shared by every clone and kit home on the machine."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "gpukit" / "images"


def cache_dir(home: Path) -> Path:
    """The cache directory (not created here). A path that can never be a directory (a file, or a file
    above it) is one GlueError line, for listing as for building."""
    base = os.environ.get("GPUKIT_IMAGES")
    path = Path(base).resolve() if base else machine_cache()
    for above in (path, *path.parents):
        if above.exists():
            if not above.is_dir():
                raise _error(path, NotADirectoryError(20, "Not a directory"))
            break
    return path


def ensure(cache: Path, home: Path) -> None:
    """Create the cache directory, or fail in one line saying which path and how to fix it."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if not os.access(cache, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise _error(cache, exc) from None


def _error(path: Path, exc: OSError) -> GlueError:
    return GlueError(state_dir_error(path, exc, "GPUKIT_IMAGES", os.environ.get("GPUKIT_IMAGES"),
                                     f"the cache is then {machine_cache()}"))


@dataclass(frozen=True)
class Image:
    name: str
    hash: str
    path: Path
    size_bytes: int
    build_seconds: float
    built_at: str
    packages: tuple[str, ...]

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["packages"] = list(self.packages)
        return d


def entry_dir(cache: Path, recipe: Recipe, digest: str) -> Path:
    return cache / f"{recipe.name}-{digest[:16]}"


def read(path: Path) -> Image | None:
    """The image in a cache entry, or None for anything that is not a finished image."""
    try:
        raw = json.loads((path / META).read_text())
        if not (path / "rootfs").is_dir():
            return None
        return Image(name=str(raw["name"]), hash=str(raw["hash"]), path=path, size_bytes=int(raw["size_bytes"]),
                     build_seconds=float(raw["build_seconds"]), built_at=str(raw["built_at"]),
                     packages=tuple(raw.get("packages", [])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # damaged metadata: not a finished image
        return None


def lookup(cache: Path, recipe: Recipe, digest: str) -> Image | None:
    return read(entry_dir(cache, recipe, digest))


def list_images(cache: Path) -> list[Image]:
    if not cache.is_dir():
        return []
    found = (read(p) for p in sorted(cache.iterdir()) if p.is_dir() and not p.name.startswith("."))
    return [img for img in found if img is not None]

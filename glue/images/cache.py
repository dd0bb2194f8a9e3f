"""The image cache: <cache>/<name>-<hash16>/{rootfs/, image.json}, one directory per recipe hash.

A directory appears only by an atomic rename of a finished build, so whatever is in the cache is
complete; builds in progress live in `.build-*` directories, removed when the build fails.
The cache is `<kit home>/images`, or $GPUKIT_IMAGES (the test suite shares one per clone).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from glue.images.recipe import Recipe

META = "image.json"


def cache_dir(home: Path) -> Path:
    base = os.environ.get("GPUKIT_IMAGES")
    return Path(base).resolve() if base else home / "images"


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
    except (OSError, ValueError):
        return None
    if not (path / "rootfs").is_dir():
        return None
    return Image(name=raw["name"], hash=raw["hash"], path=path, size_bytes=int(raw["size_bytes"]),
                 build_seconds=float(raw["build_seconds"]), built_at=raw["built_at"],
                 packages=tuple(raw.get("packages", [])))


def lookup(cache: Path, recipe: Recipe, digest: str) -> Image | None:
    return read(entry_dir(cache, recipe, digest))


def list_images(cache: Path) -> list[Image]:
    if not cache.is_dir():
        return []
    found = (read(p) for p in sorted(cache.iterdir()) if p.is_dir() and not p.name.startswith("."))
    return [img for img in found if img is not None]

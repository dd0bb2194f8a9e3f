"""glue image build / list: the VM image every local (and qemu) VM boots."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from glue.errors import GlueError
from glue.images import build as image_build
from glue.images import cache, recipe
from glue.paths import home

err = Console(stderr=True)


def _size(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


@click.group()
def image() -> None:
    """VM images baked from Debian packages (recipes under images/), cached by content hash."""


@image.command("build")
@click.option("--name", default="gpukit", show_default=True, help="The recipe: images/<name>/recipe.yaml.")
@click.option("--recipes", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of recipes (default: the kit's images/).")
@click.option("--force", is_flag=True, help="Bake again even when the cache has this recipe's image (refused while "
                                            "a running VM boots that image: `glue down` first).")
def build_cmd(name: str, recipes: Path | None, force: bool) -> None:
    """Bake the image (mmdebstrap, the recipe's files, rclone, the venv); a cached one is reused."""
    rec = recipe.load(name, recipes)
    # A terminated build still removes its partial image (the build's cleanup runs on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with err.status(f"image {rec.name}: checking the cache") as status:
        def step(what: str) -> None:
            status.update(f"image {rec.name}: {what}")
            err.log(f"[dim]{what}[/]")

        img, baked = image_build.build(rec, home(), step, force=force)
    verb = "baked" if baked else "cached"
    err.print(f"image [bold]{img.name}[/] {img.hash[:16]} {verb}: {_size(img.size_bytes)}, "
              f"built in {img.build_seconds:.0f} s, at {img.path}")


@image.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """The images in the cache: name, hash, size, build time, and whether the recipe still matches."""
    images = cache.list_images(cache.cache_dir(home()))
    current: dict[str, str] = {}
    for img in images:
        if img.name not in current:
            try:
                current[img.name] = recipe.load(img.name).content_hash()
            except GlueError:
                current[img.name] = ""
    if as_json:
        out = [{**img.as_dict(), "current": current.get(img.name) == img.hash} for img in images]
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if not images:
        err.print("no images yet; `glue image build` bakes one")
        return
    table = Table(box=None)
    for col in ("name", "hash", "size", "build", "built at", "current"):
        table.add_column(col)
    for img in images:
        table.add_row(img.name, img.hash[:16], _size(img.size_bytes), f"{img.build_seconds:.0f} s", img.built_at,
                      "yes" if current.get(img.name) == img.hash else "no (recipe changed)")
    Console().print(table)


COMMANDS = [image]

"""Image recipes and the image cache: the content hash follows every byte of the recipe, the cache
holds only finished images, and bad recipes or a missing tool are one clear line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.images import build, cache, recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "images" / "gpukit", tmp_path / "gpukit")
    return tmp_path


def test_shipped_recipe_loads() -> None:
    rec = recipe.load("gpukit")
    for pkg in ("systemd-sysv", "openssh-server", "fuse3", "python3", "docker.io"):
        assert pkg in rec.packages
    assert rec.venv_path == "/opt/gpukit/venv" and any(r.startswith("torch==") for r in rec.venv_requirements)
    assert rec.customize.is_file() and (rec.files / "usr/local/sbin/gpukit-firstboot").is_file()


def test_hash_changes_with_any_recipe_byte_and_only_then(recipes: Path) -> None:
    first = recipe.load("gpukit", recipes).content_hash()
    assert recipe.load("gpukit", recipes).content_hash() == first
    unit = recipes / "gpukit/files/etc/systemd/system/gpukit-firstboot.service"
    unit.write_text(unit.read_text() + "\n# changed\n")
    second = recipe.load("gpukit", recipes).content_hash()
    assert second != first
    (recipes / "gpukit/customize.sh").chmod(0o644)
    assert recipe.load("gpukit", recipes).content_hash() != second


def test_bad_recipes_are_one_line(recipes: Path) -> None:
    with pytest.raises(GlueError, match="no image recipe 'nope'"):
        recipe.load("nope", recipes)
    path = recipes / "gpukit/recipe.yaml"
    path.write_text(path.read_text().replace("  - fuse3", "  - 'Fuse3; rm -rf /'"))
    with pytest.raises(GlueError, match="is not a Debian package name"):
        recipe.load("gpukit", recipes)


def _fake_entry(root: Path, rec: recipe.Recipe, digest: str, complete: bool) -> Path:
    entry = cache.entry_dir(root, rec, digest)
    (entry / "rootfs/etc").mkdir(parents=True)
    if complete:
        (entry / cache.META).write_text(json.dumps({"name": rec.name, "hash": digest, "size_bytes": 1000,
                                                    "build_seconds": 3.5, "built_at": "2026-01-01T00:00:00Z"}))
    return entry


def test_cache_holds_only_finished_images(tmp_path: Path, recipes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    root = cache.cache_dir(tmp_path)
    rec = recipe.load("gpukit", recipes)
    digest = rec.content_hash()
    _fake_entry(root, rec, "0" * 64, complete=False)  # a build without its image.json
    (root / f".build-gpukit-{digest[:16]}-1/rootfs").mkdir(parents=True)
    assert cache.list_images(root) == [] and cache.lookup(root, rec, digest) is None
    _fake_entry(root, rec, digest, complete=True)
    found = cache.lookup(root, rec, digest)
    assert found is not None and found.rootfs.is_dir()
    # A cached image is returned without baking (nothing runs: mmdebstrap need not even exist).
    monkeypatch.setenv("PATH", "/nonexistent")
    image, baked = build.build(rec, tmp_path)
    assert (image.hash, baked) == (digest, False)


def test_missing_mmdebstrap_is_one_line_naming_the_package(tmp_path: Path, recipes: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(GlueError, match="install the Debian package mmdebstrap"):
        build.build(recipe.load("gpukit", recipes), tmp_path)
    assert not any((tmp_path / "cache").glob("gpukit-*"))


def test_image_list_json_and_help(tmp_path: Path) -> None:
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path), "GPUKIT_IMAGES": str(tmp_path / "images")}
    for args in (["image", "--help"], ["image", "build", "--help"], ["image", "list", "--help"]):
        out = subprocess.run([sys.executable, "-m", "glue.cli", *args], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and "Usage:" in out.stdout
    out = subprocess.run([sys.executable, "-m", "glue.cli", "image", "list", "--json"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout) == []
    out = subprocess.run([sys.executable, "-m", "glue.cli", "image", "build", "--name", "nope"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == ["Error: no image recipe 'nope' (known: gpukit)"]


def test_a_bad_vm_size_fails_glue_up_in_one_line_before_any_bake(tmp_path: Path) -> None:
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path / "home"), "GPUKIT_IMAGES": str(tmp_path / "images"),
           "GPUKIT_VM_MEMORY_GB": "lots"}
    out = subprocess.run([sys.executable, "-m", "glue.cli", "up", "--vms", "1"], env=env, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == \
        "Error: GPUKIT_VM_MEMORY_GB='lots': use a whole number from 1 to 4096, or unset it for no limit"
    assert not (tmp_path / "images").exists() or not any((tmp_path / "images").iterdir())  # nothing baked
    assert not list((tmp_path / "home").glob("terraform/*/terraform.tfstate"))  # nothing created

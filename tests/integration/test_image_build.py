"""Baking with the real mmdebstrap: a recipe naming a package Debian does not have fails with one line
naming it and caches nothing; the shipped image is baked once and then served from the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glue.paths import PROJECT_ROOT

pytestmark = pytest.mark.integration
GLUE = [sys.executable, "-m", "glue.cli"]


# `stress` (make test-all, since 2026-12-07: the suite's time): mmdebstrap resolves against the Debian archive
# (~90 s here) before it names the package; make test builds and lists the shipped image (below).
@pytest.mark.stress
def test_missing_package_is_one_line_and_nothing_cached(tmp_path: Path) -> None:
    images = tmp_path / "images"
    shutil.copytree(PROJECT_ROOT / "images" / "gpukit", images / "tiny")
    (images / "tiny" / "recipe.yaml").write_text(
        "name: tiny\nsuite: bookworm\nvariant: apt\npackages: [gpukit-no-such-package]\n")
    cache = tmp_path / "cache"
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path / "home"), "GPUKIT_IMAGES": str(cache)}
    out = subprocess.run([*GLUE, "image", "build", "--name", "tiny", "--recipes", str(images)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == "Error: image recipe package 'gpukit-no-such-package' does not exist in the Debian archive"
    assert "Traceback" not in out.stderr
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []  # no image, no partial build


def test_shipped_image_is_cached_and_listed() -> None:
    env = dict(os.environ)  # the suite's shared GPUKIT_IMAGES (tests/conftest.py)
    subprocess.run([*GLUE, "image", "build"], env=env, check=True, capture_output=True, timeout=900)
    again = subprocess.run([*GLUE, "image", "build"], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and " cached: " in again.stderr, again.stderr
    listed = json.loads(subprocess.run([*GLUE, "image", "list", "--json"], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    current = [img for img in listed if img["current"]]
    assert len(current) == 1 and current[0]["name"] == "gpukit" and current[0]["size_bytes"] > 100e6
    # The venv's bytecode is baked: no VM compiles torch on its first import.
    site = Path(current[0]["path"]) / "rootfs/opt/gpukit/venv/lib"
    assert next(site.glob("python3*/site-packages/torch/__pycache__/__init__.cpython-*.pyc"), None), site


def test_a_docker_base_import_cut_short_leaves_no_process_behind(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The import (the image's dockerd in a throwaway nspawn container) killed mid-way by its time limit:
    one line, and the container's processes (dockerd, tar, docker import) are gone with it."""
    from glue.errors import GlueError
    from glue.images import build, docker_seed, recipe

    image, _ = build.build(recipe.load("gpukit"), tmp_path)  # the suite's shared cache: baked once
    monkeypatch.setattr(docker_seed, "IMPORT_TIMEOUT_S", 4)  # ~15 s in full on an idle 2-core host
    with pytest.raises(GlueError, match=r"importing the Docker base gpukit-base:vm .* took over 4 s"):
        docker_seed.import_base(image, tmp_path / "docker", docker_seed.base())
    deadline = time.monotonic() + 30  # killed processes are reaped, not at once on a busy host
    while (left := subprocess.run(["pgrep", "-f", "gpukit-seed.sock"], capture_output=True,
                                  text=True).stdout.split()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(left)], capture_output=True,
                                      text=True).stdout

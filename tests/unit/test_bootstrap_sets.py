"""scripts/bootstrap.sh core (what `make up`/`down` run first): the local backends' Debian packages only where
the VMs are local. For a cloud backend, asked by BACKEND or remembered in the kit home's cluster.json, a
user without root and without mmdebstrap, systemd-nspawn, fuse3 or sudo gets through to the venv."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the script runs before the venv's stamp says all is installed; none of the local backends' tools.
TOOLS = ("bash", "env", "sha256sum", "cut", "cat", "sed", "dirname", "id", "ssh")
NOBODY = 65534


@pytest.fixture
def sandbox() -> Iterator[tuple[Path, dict[str, str]]]:
    """A PATH without mmdebstrap, systemd-nspawn, fusermount3, sudo; a venv whose stamp is current; in a
    folder the unprivileged user can reach (pytest's tmp_path is under a 0700 folder)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the script as an unprivileged user")
    tmp_path = Path(tempfile.mkdtemp(prefix="gpukit-bootstrap-"))
    try:
        yield _sandbox(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on PATH here"
        (bin_dir / tool).symlink_to(found)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "glue"):  # the stamp is current: only compileall runs, here a no-op
        (venv / "bin" / name).write_text("#!/bin/sh\nexit 0\n")
        (venv / "bin" / name).chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".gpukit-stamp").write_text(f"{digest} controller,train\n")
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o755)
    env = {"PATH": str(bin_dir), "VENV": str(venv), "GPUKIT_HOME": str(home), "HOME": str(tmp_path)}
    return home, env


def bootstrap(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    as_nobody = [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run([*as_nobody, str(ROOT / "scripts" / "bootstrap.sh"), "core"],
                          env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_cloud_backend_needs_no_local_debian_package(sandbox: tuple[Path, dict[str, str]]) -> None:
    home, env = sandbox
    res = bootstrap({**env, "BACKEND": "lyceum"})
    assert res.returncode == 0, res.stderr
    assert "Debian" not in res.stdout + res.stderr
    # `make down` passes no BACKEND: the kit home's cluster says which.
    (home / "cluster.json").write_text(json.dumps({"backend": "lyceum", "vms": 1}))
    res = bootstrap(env)
    assert res.returncode == 0, res.stderr


def test_the_local_backend_still_asks_for_its_packages(sandbox: tuple[Path, dict[str, str]]) -> None:
    home, env = sandbox
    for extra in ({"BACKEND": "local"}, {}):  # asked, or a kit home with no cluster yet
        res = bootstrap({**env, **extra})
        assert res.returncode == 1, res.stdout + res.stderr
        line = res.stderr.strip()
        assert line.startswith("bootstrap: missing Debian packages") and "mmdebstrap" in line, line
        assert "run: sudo apt-get install -y" in line and "\n" not in line
    (home / "cluster.json").write_text(json.dumps({"backend": "qemu"}))
    assert "qemu-system-x86" in bootstrap(env).stderr  # the kit home's cluster is on qemu: its packages too

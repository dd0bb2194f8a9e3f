"""Kit fixtures shared by integration and e2e tests: a throwaway kit home, one configured cluster for
the whole session, and the real `glue` CLI run as a subprocess. Registered by tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket

GLUE = [sys.executable, "-m", "glue.cli"]


@dataclass
class Kit:
    home: Path
    env: dict[str, str]

    def glue(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*GLUE, *args], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"glue {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[Kit]:
    """A fresh GPUKIT_HOME; every VM and the bucket server it started are gone afterwards."""
    home = tmp_path / "gpukit-home"
    home.mkdir()
    env = {**os.environ, "GPUKIT_HOME": str(home)}
    yield Kit(home=home, env=env)
    backend = LocalBackend(home)
    if backend.vms_dir.is_dir():
        for vm_dir in backend.vms_dir.iterdir():
            backend.delete_vm(vm_dir.name)
    LocalBucket(home).stop()


@pytest.fixture(scope="session")
def cluster_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """One configured 2-VM cluster (terraform + the Ansible playbook) shared by the run tests."""
    home = tmp_path_factory.mktemp("cluster") / "home"
    home.mkdir()
    kit = Kit(home=home, env={**os.environ, "GPUKIT_HOME": str(home)})
    kit.glue("up", "--vms", "2", timeout=600)
    yield kit
    kit.glue("down", "--force", check=False) if "--force" in kit.glue("down", "--help").stdout else \
        kit.glue("down", check=False)
    backend = LocalBackend(home)
    if backend.vms_dir.is_dir():
        for vm_dir in backend.vms_dir.iterdir():
            backend.delete_vm(vm_dir.name)
    LocalBucket(home).stop()

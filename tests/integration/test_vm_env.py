"""A default (overlay) local VM holds nothing of the controller's: not the kit home (the SSH key that
is root on every VM, bucket credentials), even where it sits inside the project tree the VM sees
read-only, and not the controller's environment, in PID 1's or any other process's. Real unshare,
real sshd, checked over the VM's SSH."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.base import VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.infra.ssh_keys import client_key, public_key
from glue.paths import PROJECT_ROOT
from tests.kit import vm_ssh

pytestmark = pytest.mark.integration

MARKER_ENV = "GPUKIT_TEST_CONTROLLER_MARKER"
MARKER = "controller-secret-marker"


@pytest.fixture
def home_in_project() -> Iterator[Path]:
    """A kit home where the default one lives (<project>/.gpukit*), inside the tree the VM sees."""
    home = PROJECT_ROOT / f".gpukit-test-{uuid.uuid4().hex[:8]}"
    home.mkdir()
    yield home
    backend = LocalBackend(home)
    if backend.vms_dir.is_dir():
        for vm_dir in backend.vms_dir.iterdir():
            backend.delete_vm(vm_dir.name)
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_local_vm_sees_neither_the_kit_home_nor_the_controllers_environment(
    home_in_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = home_in_project
    monkeypatch.setenv(MARKER_ENV, MARKER)
    monkeypatch.setenv("LYCEUM_API_KEY", f"lk_{MARKER}")
    (home / "bucket").mkdir()
    (home / "bucket" / "credentials.json").write_text('{"secret_key": "bucket-secret-in-kit-home"}')
    backend = LocalBackend(home)
    vm = backend.create_vm(VMSpec(name="envcheck", gpu_type="none", gpu_count=0, disk_gb=1,
                                  ssh_public_key=public_key(home)))
    key = client_key(home)
    assert key.read_text().startswith("-----BEGIN")  # the controller reads it...
    rc, out = vm_ssh(home, vm, f"test -d {PROJECT_ROOT}/glue && echo project-visible; "
                             f"ls -A {home} 2>/dev/null | wc -l; cat {key} {home}/bucket/credentials.json 2>&1; "
                             "echo ENVIRON; tr '\\0' '\\n' </proc/1/environ; echo SESSION; env; "
                             f"echo GREP; grep -l {MARKER} /proc/[0-9]*/environ 2>/dev/null; echo END")
    assert rc == 0 and out.rstrip().endswith("END"), out
    assert "project-visible" in out  # the VM does see the project tree around the kit home...
    assert "\n0\n" in out, f"the kit home is not empty on the VM:\n{out}"  # ...but not the kit home (empty or absent)
    assert "BEGIN" not in out and "bucket-secret-in-kit-home" not in out, out
    environ = out.split("ENVIRON", 1)[1].split("SESSION", 1)[0]
    assert "PATH=" in environ  # it is PID 1's environment, and it holds only the allow-list
    assert MARKER not in out and MARKER_ENV not in out and "LYCEUM_API_KEY" not in out, out

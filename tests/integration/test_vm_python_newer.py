"""The VM side on a newer Python than this host's 3.11, for real: Debian 13's Python 3.13 in a chroot
(mmdebstrap from Debian's archive, as the VM image is baked), with numpy and boto3 from Debian, no torch
(not packaged there). Every torch-free module of glue.train, memprobe's VM trial and the glue launcher
import with DeprecationWarnings as errors, and the torch-free unit tests of the trainer library pass.
make lint checks the same code statically as 3.10 and 3.12 (tests/lint_vm_python.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.stress]  # a Debian chroot (~340 MB) from the archive

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = "python3,python3-numpy,python3-boto3,python3-yaml,python3-pytest"
# Unit tests of the trainer library that need no torch (nor the docs, nor the controller's packages).
TORCH_FREE_TESTS = ("tests/unit/test_layout.py", "tests/unit/test_train_fence.py",
                    "tests/unit/test_train_mount_paths.py", "tests/unit/test_watch_notice.py")
TORCH_STACK = ("torch", "torchdata", "transformers", "accelerate", "lightning", "pytorch_lightning")
IMPORTS = f"""
import importlib, json, pkgutil, sys, warnings
warnings.simplefilter("error", DeprecationWarning)
import glue.train
names = [m.name for m in pkgutil.walk_packages(glue.train.__path__, "glue.train.")]
names += ["glue.memprobe.vm_trial", "glue.memprobe.runner", "glue.memprobe.worker", "glue.launch"]
done, bad = 0, []
for name in names:
    try:
        importlib.import_module(name)
        done += 1
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in {TORCH_STACK!r}:
            bad.append(f"{{name}}: {{exc!r}}")
    except Exception as exc:
        bad.append(f"{{name}}: {{exc!r}}")
print(json.dumps({{"version": list(sys.version_info[:2]), "imported": done, "bad": bad}}))
"""


@pytest.fixture(scope="module")
def trixie() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("needs root and mmdebstrap (make bootstrap installs it)")
    root = Path(tempfile.mkdtemp(prefix="gpukit-trixie-"))
    try:
        res = subprocess.run(["mmdebstrap", "--variant=apt", f"--include={PACKAGES}", "trixie", str(root)],
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-2000:]
        src = root / "src"
        for name in ("glue", "tests", "pyproject.toml"):
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / name, src / name)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def in_chroot(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    chroot = [shutil.which("chroot") or "/usr/sbin/chroot", str(root)]
    return subprocess.run([*chroot, "sh", "-c", 'cd /src && exec "$@"', "sh", *argv], capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def test_the_vm_side_imports_on_python_313(trixie: Path) -> None:
    res = in_chroot(trixie, "python3", "-c", IMPORTS)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert found["version"] == [3, 13] and found["imported"] >= 40 and found["bad"] == [], found


def test_the_trainer_librarys_torch_free_tests_pass_on_python_313(trixie: Path) -> None:
    res = in_chroot(trixie, "python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-o",
                    "addopts=", *TORCH_FREE_TESTS)
    assert res.returncode == 0, res.stdout[-3000:]
    assert " passed" in res.stdout and "failed" not in res.stdout, res.stdout[-500:]

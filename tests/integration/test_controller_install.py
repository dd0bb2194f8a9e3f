"""A controller installed as a cloud user would: the gpukit wheel, built from this tree, `pip install`ed into a
fresh venv by a user without root, from the package registries pip is configured with (no checkout, no
Debian package). Then `glue --help`, and `glue doctor --backend lyceum` green against the Lyceum emulator:
the Terraform envs and the provider come from the wheel, Ansible from its dependencies. Without the
[controller] extra or without terraform on PATH, glue says in one line what is missing. The wheel also
carries what the trainer role builds a VM's gpukit wheel from: that build works from the installed kit."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lyceum_emulator import Emulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
# What `pip wheel` of a checkout reads: the package, its data files (setup.py) and the metadata's files.
TREE = ("glue", "ansible", "terraform", "images", "pyproject.toml", "README.md", "setup.py")
# A Python >= 3.11 outside root's home, with venv: the one a user of this machine has.
PYTHON = "/usr/bin/python3"
DPKG_STATUS = Path("/var/lib/dpkg/status")


@dataclass
class Install:
    folder: Path  # the user's home too (pip's cache, ~/.gpukit)
    wheel: Path
    venv: Path

    def env(self, path: str | None = None, **extra: str) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the host's index settings
        return {**keep, "HOME": str(self.folder), "LANG": "C.UTF-8",
                "PATH": path or f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin", **extra}

    def run(self, *argv: str, path: str | None = None, timeout: float = 300,
            **extra: str) -> subprocess.CompletedProcess[str]:
        """As an unprivileged user (uid 65534): nothing here may need root."""
        as_user = [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        return subprocess.run([*as_user, *argv], env=self.env(path, **extra), cwd=self.folder, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _dpkg_state() -> str:
    return hashlib.sha256(DPKG_STATUS.read_bytes()).hexdigest() if DPKG_STATUS.exists() else ""


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not Path(PYTHON).exists():
        pytest.skip("needs root (to act as an unprivileged user with setpriv) and /usr/bin/python3")
    folder = Path(tempfile.mkdtemp(prefix="gpukit-controller-"))  # not under pytest's 0700 tmp folders
    try:
        src = folder / "src"
        for name in TREE:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", ".terraform"))
            else:
                shutil.copy2(ROOT / name, src / name)
        built = subprocess.run([str(ROOT / ".venv" / "bin" / "pip"), "wheel", "-q", "--no-deps",
                                "--no-build-isolation", "-w", str(folder / "dist"), str(src)],
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        shutil.rmtree(src)
        wheel = next((folder / "dist").glob("gpukit-*.whl"))
        folder.chmod(0o755)
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(folder)], check=True)
        yield Install(folder, wheel, folder / "venv")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_wheel_carries_the_kit(install: Install) -> None:
    """What `glue up` drives besides Python: playbooks, roles, Terraform envs and module, image recipes."""
    names = set(zipfile.ZipFile(install.wheel).namelist())
    data = "gpukit-0.1.0.data/data/share/gpukit/"
    tracked = subprocess.run(["git", "ls-files", "ansible", "terraform", "images"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked and {data + name for name in tracked} <= names, sorted({data + n for n in tracked} - names)[:5]
    assert {data + "pyproject.toml", "glue/launch.py", "glue/train/run/supervise.py"} <= names
    assert not any(".tfstate" in n or "/.terraform/" in n or n.endswith(".pyc") for n in names)


def test_pip_install_without_root_gives_a_working_glue(install: Install) -> None:
    dpkg_before = _dpkg_state()
    made = install.run(PYTHON, "-m", "venv", str(install.venv))
    assert made.returncode == 0, made.stderr

    # The wheel alone (the VM's install): glue names what the controller lacks, in one line.
    bare = install.run(f"{install.venv}/bin/pip", "install", "-q", "--no-deps", str(install.wheel))
    assert bare.returncode == 0, bare.stderr
    res = install.run("glue", "--help")
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and "click" in line and "pip install 'gpukit[controller]'" in line, line

    # The controller: Ansible, the Terraform provider's framework, rclone... from the package's dependencies.
    full = install.run(f"{install.venv}/bin/pip", "install", "-q", "--no-compile", f"{install.wheel}[controller]",
                       timeout=900)
    assert full.returncode == 0, full.stderr
    for tool in ("glue", "ansible-playbook", "rclone", "terraform-provider-gpukit"):
        assert (install.venv / "bin" / tool).exists(), tool
    res = install.run("glue", "--help")
    assert res.returncode == 0 and "doctor" in res.stdout and "up" in res.stdout, res.stderr
    assert _dpkg_state() == dpkg_before  # no Debian package was installed (nor could be: not root)


def test_doctor_for_a_cloud_backend_from_the_installed_kit(install: Install, tmp_path: Path) -> None:
    if not (install.venv / "bin" / "ansible-playbook").exists():
        pytest.skip("the controller install above failed")
    with Emulator(tmp_path / "emu", boot_vms=False) as emu:
        env = {**emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu"}
        res = install.run("glue", "doctor", "--backend", "lyceum", **env)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
        assert [line.split(":")[0] for line in res.stdout.strip().splitlines()] == [
            "✓ API key", "✓ capacity", "✓ storage credentials", "✓ bucket probe", "✓ SSH key", "✓ terraform",
            "✓ provider mirror"], res.stdout
        # The kit's state in the user's home, not in the venv a reinstall replaces.
        assert f"{install.folder}/.gpukit/terraform/mirror" in res.stdout
        # The ssh backend's checks from the same install: its env and the provider too (no hosts given yet).
        res = install.run("glue", "doctor", "--backend", "ssh")
        assert "Traceback" not in res.stderr and "✓ terraform: terraform" in res.stdout, res.stdout + res.stderr
        assert "✓ provider mirror" in res.stdout and "✗ SSH hosts" in res.stdout, res.stdout

        # terraform not on PATH: its own line with the fix, doctor fails; `glue up` says the same, creates nothing.
        bare_path = f"{install.venv}/bin:/usr/bin:/bin"
        assert shutil.which("terraform", path=bare_path) is None
        res = install.run("glue", "doctor", "--backend", "lyceum", path=bare_path, **env)
        assert res.returncode == 1 and "Traceback" not in res.stderr
        assert "✗ terraform: terraform is not on PATH" in res.stdout, res.stdout
        res = install.run("glue", "up", "--backend", "lyceum", "--vms", "1", path=bare_path, **env)
        assert res.returncode != 0 and "Traceback" not in res.stderr
        assert res.stderr.strip().endswith("terraform is not on PATH; install Terraform >= 1.5 and run the command "
                                           "again"), res.stderr
        assert emu.vms == {}


def test_the_trainer_wheel_builds_from_the_installed_kit(install: Install) -> None:
    """The trainer role's `pip wheel` of the kit (share/gpukit, glue/ linked to the installed package by
    glue.infra.source_hash), run by the controller's Python as the role runs it."""
    if not (install.venv / "bin" / "ansible-playbook").exists():
        pytest.skip("the controller install above failed")
    py = str(install.venv / "bin" / "python")
    res = install.run(py, "-c", "from glue.infra.source_hash import source_hash; print(source_hash())")
    assert res.returncode == 0, res.stderr
    kit = install.venv / "share" / "gpukit"
    out = install.folder / "vm-wheel"
    res = install.run(py, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
                      str(out), str(kit), SOURCE_DATE_EPOCH="315532800", GPUKIT_WHEEL_FOR_VM="1")
    assert res.returncode == 0, res.stderr
    names = set(zipfile.ZipFile(next(out.glob("gpukit-*.whl"))).namelist())
    assert {"glue/train/run/supervise.py", "glue/train/workspace/__main__.py", "glue/launch.py"} <= names
    assert not any("share/gpukit" in n for n in names)  # the VM gets the code, not the kit's data files


# `stress` (make test-all): VMs of the emulator's own; make test covers the install, doctor and the VM wheel.
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_glue_up_and_down_on_lyceum_from_the_installed_controller(install: Install, tmp_path: Path) -> None:
    """The user path end to end, still without root on the controller: `glue up` of one emulated Lyceum VM
    configured by the playbooks from the installed kit (the VM's gpukit wheel built from it), verified
    ready (the trainer runtime imports glue.train), then `glue down`."""
    if not (install.venv / "bin" / "ansible-playbook").exists():
        pytest.skip("the controller install above failed")
    group_vars = install.folder / ".gpukit" / "ansible" / "group_vars"
    group_vars.mkdir(parents=True, exist_ok=True)  # the emulator's VMs cannot run nft (docs/lyceum.md)
    (group_vars / "all.yml").write_text("group_firewall_enabled: false\n")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(install.folder / ".gpukit")], check=True)
    with Emulator(tmp_path / "emu", pending_s=0.5) as emu:
        env = {**emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu", "LYCEUM_POLL_INTERVAL": "0.2",
               "LYCEUM_CREATE_TIMEOUT": "60"}
        try:
            res = install.run("glue", "up", "--backend", "lyceum", "--vms", "1", timeout=800, **env)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            res = install.run("glue", "status", "--json", **env)
            [vm] = json.loads(res.stdout)["vms"]
            assert vm["reachable"] and vm["verify"]["ready"], vm
        finally:
            down = install.run("glue", "down", timeout=300, **env)
        assert down.returncode == 0, down.stderr
        assert emu.live_vms() == []

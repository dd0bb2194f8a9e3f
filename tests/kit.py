"""Kit fixtures shared by integration and e2e tests: a throwaway kit home, one configured cluster for
the whole session, and the real `glue` CLI run as a subprocess. Registered by tests/conftest.py."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from glue.cloud.base import VMRecord
from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.infra.ansible_run import control_path_dir
from glue.infra.ssh_keys import client_key
from glue.operations import spares
from glue.tfprovider.install import provider_tmp_dir

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


def explain(kit: Kit, run: str, st: dict[str, object]) -> str:
    """A run's whole status and its incidents, for an assertion's message: a failure far from here (a CI
    host) must say why the run is in the state it is."""
    import json

    incidents = kit.glue("incidents", "--run", run, "--json", check=False)
    return f"status {json.dumps(st)}\nincidents {incidents.stdout.strip()} {incidents.stderr.strip()}"


def stop_spare_refill(home: Path) -> None:
    """A spare pool refill still running (a detached process group) must not create VMs after teardown."""
    try:
        os.killpg(int(spares.pid_path(home).read_text()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def forget_short_dirs(home: Path) -> None:
    """The short per-home directories glue keeps in /tmp (sockets: terraform's provider, SSH control
    masters): gone with a test's kit home, or every test would leave two behind."""
    for d in (provider_tmp_dir(home), control_path_dir(home)):
        if d.parent == Path("/tmp"):
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[Kit]:
    """A fresh GPUKIT_HOME; every VM and the bucket server it started are gone afterwards."""
    home = tmp_path / "gpukit-home"
    home.mkdir()
    env = {**os.environ, "GPUKIT_HOME": str(home)}
    yield Kit(home=home, env=env)
    remove_kit_home_machines(home)


def remove_kit_home_machines(home: Path) -> None:
    """Whatever a kit home started, gone: the spare refill, every VM, the bucket server, the short dirs."""
    stop_spare_refill(home)
    backend = LocalBackend(home)
    if backend.vms_dir.is_dir():
        for vm_dir in backend.vms_dir.iterdir():
            backend.delete_vm(vm_dir.name)
    LocalBucket(home).stop()
    forget_short_dirs(home)


@pytest.fixture(scope="session")
def cluster_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """One configured 2-VM cluster (terraform + the Ansible playbook) shared by the run tests."""
    home = tmp_path_factory.mktemp("cluster") / "home"
    home.mkdir()
    kit = Kit(home=home, env={**os.environ, "GPUKIT_HOME": str(home)})
    try:  # a failed up too leaves no machine running
        kit.glue("up", "--vms", "2", timeout=600)
        yield kit
    finally:
        kit.glue("down", "--force", check=False, timeout=300)
        remove_kit_home_machines(home)


@pytest.fixture(scope="session")
def oom_run(cluster_kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A run of the session's cluster whose trainer went over `deploy --memory-limit-mb` on gpukit-2, ended and
    classed oom_host (recorded: the verdict stands once its VM is gone). Shared by the tests that only read such
    a run (its class and incident, recover's refusal): one trainer start instead of one per test."""
    from glue.runs.store import RunStore
    from tests.integration.test_runs import here, run_config, wait_for

    cfg = run_config(tmp_path_factory.mktemp("oom"),
                     config={"steps": 5, "d_model": 512, "n_layer": 4, "batch_size": 64, "seq_len": 64})
    cluster_kit.glue("deploy", "--run", "oom-host", "--config", str(cfg), "--vm", "gpukit-2",
                     "--memory-limit-mb", "350")
    wait_for(here(cluster_kit), "oom-host", lambda s: s["state"] != "running", timeout=120)
    assert RunStore.open(cluster_kit.home, "oom-host").attempt(1).get("failure_class") == "oom_host"
    return "oom-host"


def stop_live_runs(kit: Kit) -> None:
    """No run of an earlier test still live on the session's cluster. A test's cleanup that kills only a
    supervisor leaves its trainer training, and a live run makes its VM busy: deploy places around it and a
    recovery moves off it rather than replace it (docs/placement.md). `glue stop` ends each one."""
    from glue.cluster import current
    from glue.runs import occupancy

    for runs in occupancy.live_on(kit.home, current.hosts(kit.home)).runs.values():
        for run in runs:
            kit.glue("stop", "--run", run, check=False)


def vm_ssh(home: Path, vm: VMRecord, command: str) -> tuple[int, str]:
    """Run a command as root on a VM straight from its backend record, trusting only its pinned host key."""
    client = paramiko.SSHClient()
    key_type, key_b64 = vm.host_key.split()[:2]
    client.get_host_keys().add(f"[{vm.ssh_host}]:{vm.ssh_port}", key_type,
                               paramiko.Ed25519Key(data=base64.b64decode(key_b64)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(vm.ssh_host, port=vm.ssh_port, username="root", key_filename=str(client_key(home)),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, err = client.exec_command(command, timeout=60)
        rc = out.channel.recv_exit_status()
        return rc, out.read().decode() + err.read().decode()
    finally:
        client.close()


def vm_processes(home: Path) -> list[int]:
    """Host PIDs of anything still running for a VM under this home (init, sshd, children)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(home / "vms") in cmd:
            found.append(int(proc.name))
    return found

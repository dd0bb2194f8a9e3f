"""Interrupting `glue up` never leaves VMs behind that no later command would remove."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from glue.cloud.base import VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.infra.ssh_keys import public_key
from tests.kit import GLUE, Kit, vm_processes

pytestmark = pytest.mark.integration


def _vm_dirs(kit: Kit) -> list[str]:
    vms = kit.home / "vms"
    return sorted(p.name for p in vms.iterdir() if p.is_dir()) if vms.is_dir() else []


def test_double_ctrl_c_during_up_then_down_leaves_no_vm(kit: Kit) -> None:
    # A terminal's Ctrl-C goes to the whole foreground process group: do the same, twice, 0.1 s apart.
    proc = subprocess.Popen([*GLUE, "up", "--vms", "2", "--no-configure"], env=kit.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not _vm_dirs(kit):  # a VM is being created right now
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "interrupted" in err and "Traceback" not in err, err[-3000:]
    kit.glue("down", "--force", timeout=300)
    assert _vm_dirs(kit) == [], "a VM created before the interrupt survived `glue down`"
    # Its machine too: a boot interrupted before its pids were recorded once left nspawn running, its folder gone.
    assert vm_processes(kit.home) == [], "a machine booted before the interrupt still runs after `glue down`"


def test_a_vm_the_state_never_recorded_is_removed(kit: Kit) -> None:
    # What a terraform killed outright (SIGKILL, power loss) leaves: a VM of this kit home outside the state.
    kit.glue("up", "--vms", "1", "--no-configure", timeout=300)
    stray = LocalBackend(kit.home).create_vm(VMSpec(name="stray", gpu_type="none", gpu_count=0, disk_gb=10,
                                                    ssh_public_key=public_key(kit.home)))
    res = kit.glue("up", "--vms", "1", "--no-configure", timeout=300)
    assert f"removed VM {stray.id}" in " ".join(res.stderr.split())
    assert stray.id not in _vm_dirs(kit) and len(_vm_dirs(kit)) == 1
    kit.glue("down", "--force", timeout=300)
    assert _vm_dirs(kit) == []


def test_a_machine_whose_pids_were_never_recorded_is_stopped_by_its_teardown(kit: Kit) -> None:
    # What a provider killed between the machine's spawn and its record leaves (the window a loaded host widens,
    # which the double Ctrl-C above once hit): a running machine whose state.json names no process.
    import json

    backend = LocalBackend(kit.home)
    vm = backend.create_vm(VMSpec(name="unrecorded", gpu_type="none", gpu_count=0, disk_gb=10,
                                  ssh_public_key=public_key(kit.home)))
    state = kit.home / "vms" / vm.id / "state.json"
    record = json.loads(state.read_text())
    state.write_text(json.dumps({"id": record["id"], "cgroups": record["cgroups"]}))
    assert vm_processes(kit.home), "the machine should be running"
    backend.delete_vm(vm.id)
    assert _vm_dirs(kit) == [] and vm_processes(kit.home) == []

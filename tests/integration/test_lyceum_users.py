"""The SSH user on Lyceum VMs, against the emulator handing out real local VMs: an image whose user is
`ubuntu` (passwordless sudo, root disabled the way cloud-init does it), or `lyceum` as on live VMs
(root's key refused), is detected, recorded in the outputs contract and the inventory, and every
glue command still runs as root (through sudo -n); a
user that cannot get root is one clear line, and the VM is deleted again."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from glue.cloud.lyceum import login
from glue.errors import GlueError
from glue.paths import ssh_client_key_path
from tests.kit import Kit
from tests.lyceum_emulator import Emulator

from .test_lyceum_e2e import error_line, lyceum_env, without_group_firewall

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.2, login_user="ubuntu") as emulator:
        yield emulator


def tf_outputs(kit: Kit, env: dict[str, str]) -> dict[str, object]:
    from glue.infra.terraform import Terraform

    tf = Terraform(kit.home, "lyceum")
    out = subprocess.run([tf.binary, "output", "-json"], cwd=kit.home / "terraform" / "lyceum",
                         env={**tf._env(), **env}, capture_output=True, text=True, check=True)
    return {k: v["value"] for k, v in json.loads(out.stdout).items()}


# `stress` (make test-all, since 2026-12-07: the suite's time): make test detects Lyceum's live user (below); this
# adds an Ubuntu image's own user.
@pytest.mark.stress
def test_ubuntu_image_user_is_detected_and_commands_run_as_root(kit: Kit, emu: Emulator) -> None:
    env = lyceum_env(kit, emu)
    kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=env)
    [vm] = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
    assert vm["ssh_user"] == "ubuntu" and vm["reachable"]
    assert tf_outputs(kit, env)["vms"]["gpukit-1"]["ssh_user"] == "ubuntu"  # type: ignore[index]
    inventory = yaml.safe_load((kit.home / "ansible" / "inventory.yml").read_text())
    assert inventory["all"]["hosts"]["gpukit-1"]["ansible_user"] == "ubuntu"
    # glue's remote commands need root: they get it through sudo.
    assert kit.glue("ssh", "gpukit-1", "--", "id", "-u", env=env).stdout.strip() == "0"
    kit.glue("ssh", "gpukit-1", "--", "sh", "-c", "echo kept > /root/marker", env=env)
    assert kit.glue("ssh", "gpukit-1", "--", "cat", "/root/marker", env=env).stdout.strip() == "kept"
    # Root really is disabled on that VM, as on a cloud image: the key logs in, commands are refused.
    [live] = emu.live_vms()
    host, port = str(live.ip_address).split(":")
    key = (kit.home / "ssh" / "known_hosts").read_text().split(maxsplit=1)[1].strip()
    with pytest.raises(GlueError, match=r'root: logged in but commands are refused \(Please login as the user '
                                        r'"ubuntu" rather than the user "root"\.\)'):
        login.detect(host, int(port), key, ssh_client_key_path(kit.home), wanted="root", deadline_s=0)
    kit.glue("down", env=env)
    assert emu.live_vms() == [] and list(emu.local.vms_dir.iterdir()) == []


def test_the_live_lyceum_user_is_found_first_and_root_is_refused(kit: Kit, tmp_path: Path) -> None:
    """As live Lyceum VMs behave: the key logs in only as `lyceum` (passwordless sudo); root is refused
    at authentication. glue finds `lyceum` without LYCEUM_SSH_USER and runs its commands as root."""
    with Emulator(tmp_path / "emu-live", pending_s=0.2, login_user="lyceum") as emu:
        env = lyceum_env(kit, emu)
        kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=env)
        [vm] = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
        assert vm["ssh_user"] == "lyceum" and vm["reachable"], vm
        assert kit.glue("ssh", "gpukit-1", "--", "id", "-u", env=env).stdout.strip() == "0"
        # glue doctor checks each VM of the cluster: its address and its user getting root.
        checks = json.loads(kit.glue("doctor", "--backend", "lyceum", "--json", env=env, check=False).stdout)["checks"]
        [vm_check] = [c for c in checks if c["name"] == "VM gpukit-1"]
        assert vm_check["ok"] and "lyceum logs in and gets root" in vm_check["detail"], checks
        [live] = emu.live_vms()
        host, port = str(live.ip_address).split(":")
        key = (kit.home / "ssh" / "known_hosts").read_text().split(maxsplit=1)[1].strip()
        with pytest.raises(GlueError, match=r"root: key not accepted"):
            login.detect(host, int(port), key, ssh_client_key_path(kit.home), wanted="root", deadline_s=0)
        kit.glue("down", env=env)
        assert emu.live_vms() == []


# `stress` (make test-all): make test refuses a root login whose commands are refused, in the same words
# (test_ubuntu_image_user_is_detected_and_commands_run_as_root), and finds the live user first
# (test_the_live_lyceum_user_is_found_first_and_root_is_refused); this adds `glue up` deleting the VM again.
@pytest.mark.stress
def test_a_user_without_root_is_one_line_and_the_vm_is_deleted(kit: Kit, emu: Emulator) -> None:
    env = lyceum_env(kit, emu, LYCEUM_SSH_USER="root", LYCEUM_CREATE_TIMEOUT="20")
    res = kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=env, check=False)
    assert res.returncode != 0
    line = error_line(res)
    assert "no login on 127.0.0.1:" in line and "gets root (root: logged in but commands are refused" in line, line
    assert "unset LYCEUM_SSH_USER to detect the user" in line and "was deleted again" in line, line
    assert emu.live_vms() == []


@pytest.mark.stress  # ~3-8 min here (the trainer venv): outside the default suite; `make test-all` runs it
@pytest.mark.timeout(900)
def test_the_playbooks_converge_and_verify_as_ubuntu(kit: Kit, emu: Emulator) -> None:
    """The whole `glue up` (site.yml, then verify.yml) on a VM whose login is ubuntu: every play
    escalates through sudo, the bucket is mounted and the trainer runtime works."""
    env = lyceum_env(kit, emu)
    without_group_firewall(kit.home)
    kit.glue("up", "--backend", "lyceum", "--vms", "1", env=env, timeout=900)
    [vm] = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
    assert vm["ssh_user"] == "ubuntu" and vm["verify"]["ready"], vm
    inventory = yaml.safe_load((kit.home / "ansible" / "inventory.yml").read_text())
    assert inventory["all"]["hosts"]["gpukit-1"]["ansible_become"] is True
    # What the plays made belongs to root, not to the login user.
    owner = kit.glue("ssh", "gpukit-1", "--", "stat", "-c", "%U", "/etc/gpukit/rclone.conf", env=env, check=False)
    assert owner.stdout.strip() == "root", owner
    kit.glue("down", env=env)
    assert emu.live_vms() == []


@pytest.mark.e2e
@pytest.mark.stress  # the whole demo: ~5-15 min here
@pytest.mark.timeout(1800)
def test_demo_with_the_ubuntu_user(kit: Kit, tmp_path: Path) -> None:
    """The whole loop (up, train, lose a VM, recover, verify, down) when the VMs' login is ubuntu.
    Credentials live an hour here: a recover that outlives them fails at its lease release (the lease
    holds the credentials its command started with), which is not what this test is about."""
    with Emulator(tmp_path / "emu", pending_s=0.2, login_user="ubuntu", credentials_ttl=3600) as emu:
        _demo(kit, emu)


def _demo(kit: Kit, emu: Emulator) -> None:
    env = lyceum_env(kit, emu, BACKEND="lyceum")
    without_group_firewall(kit.home / "demo")  # the demo's kit home
    res = subprocess.run([sys.executable, "-m", "glue.operations.recovery.demo"], env=env, capture_output=True,
                         text=True,
                         timeout=1800, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "PASS" in res.stderr
    assert emu.live_vms() == []

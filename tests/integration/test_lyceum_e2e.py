"""`glue up --backend lyceum` end to end against the Lyceum emulator (real terraform, real local VMs
behind the API, the real CLI): SSH with a pinned key, a lost VM replaced, nothing left after down,
no secret in any file the kit writes, and every bad input as one clear line with nothing left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.bucket_access import BucketInfo
from glue.cloud.lyceum.backend import LyceumBackend
from glue.storage import bucket as bucket_store
from tests.lyceum_emulator import Emulator

from .conftest import Kit

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.5) as emulator:
        yield emulator


def lyceum_env(kit: Kit, emu: Emulator, **extra: str) -> dict[str, str]:
    env = {**kit.env, **emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu", "LYCEUM_POLL_INTERVAL": "0.2",
           "LYCEUM_CREATE_TIMEOUT": "60", **extra}
    return {k: v for k, v in env.items() if v != ""}


def without_group_firewall(home: Path) -> None:
    """As docs/lyceum.md says for the emulator: its VMs are machines on this host that cannot run nft, so
    a configured `glue up` there needs group_firewall_enabled: false in the kit home's group_vars."""
    group_vars = home / "ansible" / "group_vars"
    group_vars.mkdir(parents=True, exist_ok=True)
    (group_vars / "all.yml").write_text("group_firewall_enabled: false\n")


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The CLI's error: one 'Error:' and one line (after the terraform progress table, if any)."""
    assert res.stderr.count("Error:") == 1 and "Traceback" not in res.stderr, res.stderr
    error = res.stderr[res.stderr.index("Error:"):].strip()
    assert "\n" not in error, res.stderr
    return error


def local_state(emu: Emulator, vm_id: str) -> dict[str, object]:
    local_id = emu.vms[vm_id].local_id
    return dict(json.loads((emu.local.vms_dir / str(local_id) / "state.json").read_text()))


# `stress` (make test-all): make test runs up, ssh, a replaced VM and down on local VMs
# (tests/integration/test_cluster.py::test_up_ssh_isolation_replace_down), and `glue up`/`down` on this emulator
# (tests/integration/test_lyceum_users.py, test_lyceum_refresh.py); this joins them on the Lyceum backend.
@pytest.mark.stress
def test_up_ssh_lost_vm_replaced_down(kit: Kit, emu: Emulator) -> None:
    env = lyceum_env(kit, emu)
    kit.glue("up", "--backend", "lyceum", "--vms", "2", "--no-configure", env=env)
    st = json.loads(kit.glue("status", "--json", env=env).stdout)
    assert st["backend"] == "lyceum" and [v["name"] for v in st["vms"]] == ["gpukit-1", "gpukit-2"]
    assert all(v["reachable"] and v["backend"] == "lyceum" and v["gpu_type"] == "none" for v in st["vms"])
    assert all(v["ssh_user"] == "root" for v in st["vms"])  # a root image: detected as root, no sudo
    assert st["bucket"]["reachable"] and st["bucket"]["endpoint"] == emu.sts.endpoint
    ids = {v["name"]: v["id"] for v in st["vms"]}
    assert set(ids.values()) == {vm.vm_id for vm in emu.live_vms()}

    # The pinned key is the VM's real host key (read over SSH right after it reported running).
    known = (kit.home / "ssh" / "known_hosts").read_text()
    for vm_id in ids.values():
        assert local_state(emu, vm_id)["host_key"] in known
    assert kit.glue("ssh", "gpukit-1", "--", "hostname", env=env).stdout.strip() == "gpukit-1"
    kit.glue("ssh", "gpukit-1", "--", "sh", "-c", "echo lost > /root/marker", env=env)

    # Lyceum loses gpukit-1 (terminated out of band): the next `glue up` replaces it, keeps gpukit-2.
    emu.kill(ids["gpukit-1"])
    kit.glue("up", "--no-configure", env=env)
    st2 = json.loads(kit.glue("status", "--json", env=env).stdout)
    new_ids = {v["name"]: v["id"] for v in st2["vms"]}
    assert new_ids["gpukit-1"] != ids["gpukit-1"] and new_ids["gpukit-2"] == ids["gpukit-2"]
    assert all(v["reachable"] for v in st2["vms"])
    assert kit.glue("ssh", "gpukit-1", "--", "cat", "/root/marker", env=env, check=False).returncode != 0

    # Configuring them: the emulator's machines share this host's network and cannot manage a firewall;
    # group_firewall refuses to leave their rendezvous ports open to anyone, in one line naming the switch.
    res = kit.glue("up", env=env, check=False)
    assert res.returncode == 1, res.stderr
    line = error_line(res)
    assert "gpukit-1, gpukit-2: Fail when this VM cannot manage its firewall: " in line, line  # said once
    assert "cannot manage its firewall (nft: cache initialization failed: Operation not permitted)" in line
    assert line.endswith(f"set group_firewall_enabled: false in {kit.home}/ansible/group_vars/all.yml"), line

    # The bucket outlives the cluster; `down` leaves no VM running (or billed) anywhere.
    b = st2["bucket"]
    backend = LyceumBackend(kit.home)
    os.environ.update(emu.env())
    try:
        s3 = bucket_store.client(BucketInfo(b["endpoint"], b["name"], b["region"]), backend.bucket_credentials())
        s3.put_object(Bucket=b["name"], Key="keep/me.txt", Body=b"precious")
    finally:
        for key in emu.env():
            os.environ.pop(key, None)
    kit.glue("down", env=env)
    assert emu.live_vms() == [] and list(emu.local.vms_dir.iterdir()) == []
    assert all(vm.status == "terminated" for vm in emu.vms.values())
    assert s3.get_object(Bucket=b["name"], Key="keep/me.txt")["Body"].read() == b"precious"
    assert json.loads(kit.glue("status", "--json", env=env).stdout)["vms"] == []


def test_no_secret_in_state_plan_or_logs(kit: Kit, emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    env = lyceum_env(kit, emu)
    kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=env)
    workdir = kit.home / "terraform" / "lyceum"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from glue.infra.terraform import Terraform

    tf = Terraform(kit.home, "lyceum")
    plan = subprocess.run([tf.binary, "plan", "-input=false", "-out=saved.tfplan"], cwd=workdir, env=tf._env(),
                          capture_output=True, text=True, check=True)
    shown = subprocess.run([tf.binary, "show", "-json", "saved.tfplan"], cwd=workdir, env=tf._env(),
                           capture_output=True, text=True, check=True)
    cred_file = kit.home / "bucket" / "credentials.json"
    creds = json.loads(cred_file.read_text())
    assert oct(cred_file.stat().st_mode & 0o777) == "0o600"
    secrets = {"API key": emu.api_key, "bucket secret": creds["secret_key"], "session token": creds["session_token"]}
    texts = {"plan output": plan.stdout + plan.stderr, "plan json": shown.stdout}
    for path in kit.home.rglob("*"):
        if path.is_file() and path != cred_file and "mirror" not in path.parts and ".terraform" not in path.parts:
            texts[str(path)] = path.read_bytes().decode(errors="replace")
    for proc in Path("/proc").iterdir():  # no process carries a secret in its arguments
        try:
            texts[f"{proc}/cmdline"] = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
    assert any("terraform.tfstate" in name for name in texts)
    for what, secret in secrets.items():
        for name, text in texts.items():
            assert secret not in text, f"{what} found in {name}"
    kit.glue("down", env=env)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing key", "LYCEUM_API_KEY is not set; create an API key at"),
        ("malformed key", "LYCEUM_API_KEY is malformed"),
        ("wrong key", "Lyceum rejected the API key (401"),
        ("unknown profile", "unknown hardware profile 'tpu' (LYCEUM_HARDWARE_PROFILE): Use one of: cpu, a100, b200, "
                            "b300, h100, h200, l40s."),
        ("no capacity", "Lyceum has no capacity for cpu right now (available: a100"),
        ("stuck pending", "is still pending after 3s (LYCEUM_CREATE_TIMEOUT); Lyceum may be short of capacity; VM vm-"),
    ],
)
def test_bad_input_is_one_clear_line_and_nothing_runs(kit: Kit, emu: Emulator, case: str, needle: str) -> None:
    extra = {
        "missing key": {"LYCEUM_API_KEY": ""},
        "malformed key": {"LYCEUM_API_KEY": "lk_ spaces in it"},
        "wrong key": {"LYCEUM_API_KEY": "lk_not_a_key_the_emulator_knows"},
        "unknown profile": {"LYCEUM_HARDWARE_PROFILE": "tpu"},
        "stuck pending": {"LYCEUM_CREATE_TIMEOUT": "3"},
    }.get(case, {})
    if case == "no capacity":
        emu.set_capacity("cpu", None)
    if case == "stuck pending":
        emu.stuck_pending = True
    res = kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=lyceum_env(kit, emu, **extra),
                   check=False)
    assert res.returncode != 0
    line = error_line(res)
    assert needle in line, line
    if case in ("missing key", "malformed key", "unknown profile", "no capacity"):
        assert len(res.stderr.strip().splitlines()) == 1  # refused before terraform ran
    if case == "stuck pending":
        assert "was deleted again" in line
    assert emu.live_vms() == [] and list(emu.local.vms_dir.glob("*")) == []


@pytest.mark.e2e
@pytest.mark.stress  # ~1.5 min alone, more under load: beyond the CI budget; `make test-all` runs it
@pytest.mark.timeout(1800)
def test_demo_on_the_lyceum_backend(kit: Kit, emu: Emulator) -> None:
    env = lyceum_env(kit, emu, BACKEND="lyceum")  # `make demo BACKEND=lyceum` passes it the same way
    without_group_firewall(kit.home / "demo")  # the demo's kit home
    res = subprocess.run([sys.executable, "-m", "glue.operations.recovery.demo"], env=env, capture_output=True,
                         text=True,
                         timeout=1800, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "PASS" in res.stderr
    assert emu.live_vms() == []  # the demo ends with `down`: nothing left running or billed

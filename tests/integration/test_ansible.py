"""Ansible on local VMs: site.yml makes a fresh VM ready (bucket at /mnt/s3 proven through the S3 API),
a second run changes nothing, a replaced VM has no mount until the playbook runs again, and bad
input fails at the mount step with the cause and no half-mounted /mnt/s3."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import pytest

from glue.infra import ansible, ansible_run, inventory, ssh
from glue.infra.source_hash import WHEEL_DIR, source_hash
from glue.paths import venv_bin
from tests.testbed import LocalTestbed

pytestmark = [pytest.mark.integration]

MOUNT_TASK = "Mount the bucket at the mount point"


def _need_local_vms() -> None:
    if os.geteuid() != 0:
        pytest.skip("local VMs need root (namespaces)")
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse")


@contextmanager
def _testbed(home: Path) -> Iterator[LocalTestbed]:
    """A testbed whose VMs and bucket are gone again afterwards."""
    _need_local_vms()
    tb = LocalTestbed(home)
    try:
        yield tb
    finally:
        try:
            tb.destroy()
        finally:
            tb.stop_bucket()


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[LocalTestbed]:
    with _testbed(tmp_path / "home") as tb:
        yield tb


@pytest.fixture(scope="module")
def converged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTestbed]:
    """One VM converged by site.yml for the tests that start from a converged VM (each leaves its mount
    running): one fresh VM and one converge instead of one per test."""
    with _testbed(tmp_path_factory.mktemp("converged") / "home") as tb:
        tb.create(1)
        first = ansible.converge(tb.home, progress=False)
        assert first.ok, first.failed
        yield tb


def host(tb: LocalTestbed, name: str) -> inventory.Host:
    return {h.name: h for h in inventory.hosts_from_outputs(tb.outputs())}[name]


def sh(tb: LocalTestbed, name: str, command: str) -> ssh.CommandResult:
    return ssh.run(tb.home, host(tb, name), command, timeout=60)


def s3(tb: LocalTestbed):
    creds = json.loads((tb.home / "bucket" / "credentials.json").read_text())
    return boto3.client(
        "s3", endpoint_url=tb.bucket.endpoint, aws_access_key_id=creds["access_key"],
        aws_secret_access_key=creds["secret_key"], region_name=tb.bucket.region,
    )


def wait_object(client, key: str, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.get_object(Bucket="gpukit", Key=key)["Body"].read()
        except client.exceptions.NoSuchKey:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def assert_no_half_mount(tb: LocalTestbed, name: str) -> None:
    """Not mounted, and nothing can be written where the bucket should be."""
    r = sh(tb, name, "mountpoint -q /mnt/s3; echo mp=$?; touch /mnt/s3/x 2>/dev/null; echo w=$?; "
                     "mkdir /mnt/s3/d 2>/dev/null; echo d=$?; pgrep -f '[r]clone mount' >/dev/null; echo r=$?")
    out = dict(line.split("=") for line in r.stdout.split())
    assert out["mp"] != "0", "a mount was left at /mnt/s3"
    assert out["w"] != "0" and out["d"] != "0", "writes to the bare /mnt/s3 would land on the ephemeral disk"
    assert out["r"] != "0", "an rclone mount process was left running"


def check_mode_recap(tb: LocalTestbed) -> dict[str, dict[str, int]]:
    """site.yml under --check (what glue runs, with the same environment): host -> PLAY RECAP counts."""
    env = {**os.environ, **ansible_run.runner_env(tb.home)}
    proc = subprocess.run([str(venv_bin() / "ansible-playbook"), "--check",
                           "-i", str(inventory.inventory_path(tb.home)), str(ansible_run.ANSIBLE_DIR / "site.yml")],
                          env=env, capture_output=True, text=True, timeout=300)
    recap = proc.stdout[proc.stdout.rindex("PLAY RECAP"):] if "PLAY RECAP" in proc.stdout else ""
    counts = {m[0]: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[1])}
              for m in re.findall(r"^(\S+)\s+:\s+(.*)$", recap, re.MULTILINE)}
    assert proc.returncode == 0 and counts, proc.stdout[-3000:] + proc.stderr[-2000:]
    return counts


def assert_no_secrets(tb: LocalTestbed) -> None:
    creds = json.loads((tb.home / "bucket" / "credentials.json").read_text())
    runner = ansible.runner_dir(tb.home)
    for path in runner.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert creds["secret_key"] not in text, f"secret key in {path}"


# `stress` (make test-all): make test converges fresh VMs, round-trips through the mount of the VMs `glue up`
# verified and leaves an unchanged one alone (tests/integration/test_up_converge.py), replaces a killed VM with an
# empty disk (tests/integration/test_cluster.py::test_up_ssh_isolation_replace_down), and re-runs site.yml with
# changed=0 (test_supervisor_remounts_after_rclone_dies_and_refuses_writes_meanwhile below).
@pytest.mark.stress
def test_fresh_vms_converge_roundtrip_idempotent_and_replaced_vm_has_no_mount(bed: LocalTestbed) -> None:
    bed.create(2)
    first = ansible.converge(bed.home, progress=False)
    assert first.ok, first.failed
    assert set(first.changed) == {"gpukit-1", "gpukit-2"}
    assert all(n > 0 for n in first.changed.values())

    # Round trip: written through /mnt/s3 on the VM, read through the S3 API here. The upload waits for
    # the mount's write-back delay (1 s); the second run of the playbook starts at once.
    key = f"tests/{uuid.uuid4().hex}.txt"
    payload = f"through the mount {key}"
    r = sh(bed, "gpukit-1", f"mkdir -p /mnt/s3/tests && printf %s '{payload}' > /mnt/s3/{key} && echo ok")
    assert r.exit_code == 0 and r.stdout.strip() == "ok", r.stderr

    # The wheel was built once for this source tree; the second converge reuses it (no `pip wheel`).
    (wheel,) = (WHEEL_DIR / source_hash()).glob("gpukit-*.whl")
    built = wheel.stat().st_mtime_ns
    second = ansible.converge(bed.home, progress=False)
    assert second.ok, second.failed
    assert second.changed == {"gpukit-1": 0, "gpukit-2": 0}
    assert wheel.stat().st_mtime_ns == built
    recap = check_mode_recap(bed)  # --check on a converged VM: nothing would change, nothing fails
    assert {h: (c["changed"], c["failed"], c["unreachable"]) for h, c in recap.items()} == {
        "gpukit-1": (0, 0, 0), "gpukit-2": (0, 0, 0)}

    client = s3(bed)
    assert wait_object(client, key).decode() == payload
    # ...and the other VM sees it through its own mount (within the dir cache time).
    r = sh(bed, "gpukit-2", f"for i in $(seq 100); do cat /mnt/s3/{key} 2>/dev/null && exit 0; sleep 0.2; done; exit 1")
    assert r.stdout == payload

    summary = ansible.verify(bed.home, progress=False)
    for name in ("gpukit-1", "gpukit-2"):
        s = summary[name]
        assert s["ready"] is True, s
        assert s["mount"]["mounted"] and s["mount"]["round_trip"]
        assert s["gpu"]["present"] is False and s["gpu"]["status"] == "no_gpu"
        assert s["runtime"]["ok"] and s["runtime"]["imported"] and s["runtime"]["torch"]
    assert ansible.last_verify(bed.home)["hosts"]["gpukit-1"]["ready"] is True
    assert_no_secrets(bed)
    secret = json.loads((bed.home / "bucket" / "credentials.json").read_text())["secret_key"]
    r = sh(bed, "gpukit-1", "stat -c %a /etc/gpukit/rclone.conf; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert r.stdout.split()[0] == "600"
    assert "rclone mount" not in r.stdout or secret not in r.stdout, "credentials in process arguments"
    assert "mount gpukit:gpukit /mnt/s3" in r.stdout

    # A replaced VM: new disk, nothing mounted at /mnt/s3 until the playbook runs again.
    bed.replace("gpukit-1")
    r = sh(bed, "gpukit-1", "mountpoint -q /mnt/s3; echo $?; test -e /mnt/s3; echo $?; test -e /etc/gpukit; echo $?")
    assert r.stdout.split() == ["1", "1", "1"], r.stdout
    again = ansible.converge(bed.home, limit=["gpukit-1"], progress=False)
    assert again.ok, again.failed
    assert again.changed["gpukit-1"] > 0
    r = sh(bed, "gpukit-1", f"cat /mnt/s3/{key}")
    assert r.exit_code == 0 and r.stdout == payload, "the bucket's data survived the VM"
    assert_no_secrets(bed)


def test_verify_fails_when_mount_point_is_a_plain_directory(converged: LocalTestbed) -> None:
    bed = converged
    r = sh(bed, "gpukit-1", "/usr/local/sbin/gpukit-mount stop")
    assert r.exit_code == 0, r.stderr
    try:
        summary = ansible.verify(bed.home, progress=False)["gpukit-1"]  # one verify.yml run
        assert summary["ready"] is False and summary.get("error"), summary  # the play failed on the host
        assert summary["mount"]["mounted"] is False
        assert "not mounted" in summary["mount"]["error"] and "plain directory" in summary["mount"]["error"]
        assert_no_half_mount(bed, "gpukit-1")
    finally:  # the shared VM's mount back for the next test (`gpukit-mount start` waits until it answers)
        r = sh(bed, "gpukit-1", "/usr/local/sbin/gpukit-mount start")
        assert r.exit_code == 0, r.stdout + r.stderr


def test_a_failed_round_trip_fails_site_yml_after_the_trainer_role_ran_beside_it(bed: LocalTestbed) -> None:
    """The probe runs in the background while the trainer role installs the runtime; its failure still
    fails the play, with the probe's own message. A 0 s probe timeout cannot outlast rclone's 1 s
    write-back: the object written through the mount is not in the bucket yet."""
    bed.create(1)
    res = ansible.run_playbook("site.yml", bed.home, extravars={"bucket_mount_probe_timeout": "0"},
                               progress=False)
    assert not res.ok
    message = res.failed["gpukit-1"]
    assert message.startswith("Wait for the mount's round trip through the S3 API:"), message
    assert "round trip failed" in message and "did not appear through the S3 API within 0s" in message, message
    # The trainer role ran while the probe waited: the runtime is in place, the mount is live.
    r = sh(bed, "gpukit-1", "/opt/gpukit/venv/bin/python -c 'import glue.train' && echo imported; "
                            "findmnt -n -o FSTYPE /mnt/s3")
    assert r.stdout.split() == ["imported", "fuse.rclone"], r.stdout + r.stderr


@pytest.mark.parametrize(
    "case",
    # make test: a bad bucket and a bad mount point; the rest in make test-all (since 2026-12-07: the suite's time)
    ["wrong_credentials", "mount_point_busy", *(pytest.param(c, marks=pytest.mark.stress) for c in
                                                ("server_down", "mount_point_not_empty", "fuse_missing"))],
)
def test_bad_input_fails_at_the_mount_step_without_half_mount(bed: LocalTestbed, case: str, tmp_path: Path) -> None:
    bed.create(1)
    extravars: dict[str, str] = {}
    if case == "wrong_credentials":
        good = json.loads((bed.home / "bucket" / "credentials.json").read_text())
        bad = tmp_path / "bad-credentials.json"
        bad.write_text(json.dumps({"access_key": good["access_key"], "secret_key": "not-the-secret"}))
        bad.chmod(0o600)
        extravars["gpukit_bucket_credentials_file"] = str(bad)
        cause = "wrong bucket credentials"
    elif case == "server_down":
        bed.stop_bucket()
        cause = "bucket server down"
    elif case == "mount_point_busy":
        assert sh(bed, "gpukit-1", "mkdir -p /mnt/s3 && mount -t tmpfs scratch /mnt/s3").exit_code == 0
        cause = "mount point busy"
    elif case == "mount_point_not_empty":
        assert sh(bed, "gpukit-1", "mkdir -p /mnt/s3 && echo lost > /mnt/s3/ckpt.pt").exit_code == 0
        cause = "mount point busy"
    else:  # fuse_missing: the fuse3 userland is not installed (hidden on the VM's own disk)
        r = sh(bed, "gpukit-1", "for f in /usr/bin/fusermount3 /usr/bin/fusermount /bin/fusermount3 /bin/fusermount;"
                                " do [ -e $f ] && mv $f $f.hidden; done; command -v fusermount3 fusermount; true")
        assert r.stdout.strip() == "", r.stdout
        cause = "fuse missing"

    res = ansible.converge(bed.home, progress=False) if not extravars else ansible.run_playbook(
        "site.yml", bed.home, extravars=extravars, progress=False)
    assert not res.ok
    message = res.failed["gpukit-1"]
    assert message.startswith(MOUNT_TASK + ":"), message
    assert cause in message, message
    if case == "mount_point_busy":
        r = sh(bed, "gpukit-1", "awk '$2==\"/mnt/s3\"{print $3}' /proc/mounts; pgrep -f '[r]clone mount' || echo none")
        assert r.stdout.split() == ["tmpfs", "none"], "the foreign mount stays; no rclone left behind"
    else:
        assert_no_half_mount(bed, "gpukit-1")
    if case == "mount_point_not_empty":
        r = sh(bed, "gpukit-1", "cat /mnt/s3/ckpt.pt")
        assert r.stdout.strip() == "lost", "files already there are kept, not deleted"
    assert_no_secrets(bed)


def test_supervisor_remounts_after_rclone_dies_and_refuses_writes_meanwhile(converged: LocalTestbed) -> None:
    """The mount's systemd unit restarts a killed
    rclone; meanwhile the bare dir refuses writes."""
    bed = converged
    r = sh(bed, "gpukit-1", "pkill -9 -f '^[^ ]*rclone mount'; sleep 0.3; "
                            "touch /mnt/s3/while-down 2>/dev/null; echo w=$?")
    assert "w=0" not in r.stdout, "a write landed while the mount was down"
    r = sh(bed, "gpukit-1", "for i in $(seq 150); do /usr/local/sbin/gpukit-mount status >/dev/null && "
                            "echo back && exit 0; sleep 0.2; done; /usr/local/sbin/gpukit-mount status; exit 1")
    assert r.stdout.strip().endswith("back"), r.stdout + r.stderr
    r = sh(bed, "gpukit-1", "systemctl show -p NRestarts --value gpukit-mount")
    assert int(r.stdout.strip()) >= 1
    # What glue's credentials push runs after rewriting rclone.conf: no GPUKIT_MOUNT_CONFIG, the default settings.
    r = sh(bed, "gpukit-1", "/usr/local/sbin/gpukit-mount reload && /usr/local/sbin/gpukit-mount status")
    assert r.stdout.split() == ["started", "mounted"], r.stdout + r.stderr
    again = ansible.converge(bed.home, progress=False)
    assert again.ok and again.changed == {"gpukit-1": 0}

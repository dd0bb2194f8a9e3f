"""The foundation, end to end with real terraform, sshd and rclone: up, ssh, isolation, loss, down."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from glue.bucket_access import BucketInfo
from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.cluster import current
from glue.storage import bucket as bucket_store
from tests.kit import vm_processes

from .conftest import Kit

pytestmark = pytest.mark.integration


def vm_state(home: Path, name: str) -> dict:
    [d] = [p for p in (home / "vms").iterdir() if p.name.startswith(f"{name}-")]
    return json.loads((d / "state.json").read_text())


def test_up_ssh_isolation_replace_down(kit: Kit) -> None:
    # The bucket's port was taken by another process since the bucket last ran: `glue up` moves the bucket.
    server = LocalBucket(kit.home)
    port = int(server.ensure_running().endpoint.rsplit(":", 1)[1])
    server.stop()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        kit.glue("up", "--vms", "2", "--no-configure")
        st = json.loads(kit.glue("status", "--json").stdout)
    assert not st["bucket"]["endpoint"].endswith(f":{port}"), st["bucket"]
    assert [v["name"] for v in st["vms"]] == ["gpukit-1", "gpukit-2"]
    assert all(v["reachable"] for v in st["vms"]) and st["bucket"]["reachable"]

    # SSH works on both; a file under /root on vm 1 is private to vm 1.
    for vm in ("gpukit-1", "gpukit-2"):
        assert kit.glue("ssh", vm, "--", "hostname").stdout.strip() == vm
    marker = f"marker-{os.getpid()}"
    kit.glue("ssh", "gpukit-1", "--", "sh", "-c", f"echo {marker} > /root/{marker}")
    assert kit.glue("ssh", "gpukit-1", "--", "cat", f"/root/{marker}").stdout.strip() == marker
    assert not Path(f"/root/{marker}").exists()
    assert kit.glue("ssh", "gpukit-2", "--", "ls", f"/root/{marker}", check=False).returncode != 0

    # Kill vm 1 out of band: the next `glue up` replaces it with an empty disk.
    old = vm_state(kit.home, "gpukit-1")
    os.kill(old["init_pid"], signal.SIGKILL)
    backend = LocalBackend(kit.home)
    deadline = time.monotonic() + 30  # the machine is reaped, then reads as gone
    while backend.read_vm(old["id"]) is not None:
        assert time.monotonic() < deadline, "a killed VM still reads as alive after 30 s"
        time.sleep(0.1)
    kit.glue("up", "--no-configure")
    new = vm_state(kit.home, "gpukit-1")
    assert new["id"] != old["id"]
    assert kit.glue("ssh", "gpukit-1", "--", "ls", f"/root/{marker}", check=False).returncode != 0
    assert kit.glue("ssh", "gpukit-2", "--", "true").returncode == 0

    # A VM whose host key no longer matches the pinned one is refused, in one line: a different (valid)
    # ed25519 key pinned for gpukit-1's address, as if the VM's key had changed.
    kh = kit.home / "ssh" / "known_hosts"
    pinned = kh.read_text()
    address = current.host(kit.home, "gpukit-1").known_hosts_name
    other = (kit.home / "ssh" / "id_ed25519.pub").read_text().split()
    kh.write_text("".join(f"{address} {other[0]} {other[1]}\n" if line.split()[0] == address else line
                          for line in pinned.splitlines(keepends=True)))
    assert kh.read_text() != pinned
    res = kit.glue("ssh", "gpukit-1", "--", "true", check=False)
    assert res.returncode != 0 and "CHANGED" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    kh.write_text(pinned)

    # An object put into the bucket before `down` survives it; no VM dir or process survives.
    b = st["bucket"]
    info = BucketInfo(endpoint=b["endpoint"], name=b["name"], region=b["region"])
    s3 = bucket_store.client(info, LocalBucket(kit.home).credentials())
    s3.put_object(Bucket=info.name, Key="keep/me.txt", Body=b"precious")
    kit.glue("down")
    assert list((kit.home / "vms").iterdir()) == []
    assert vm_processes(kit.home) == []
    assert s3.get_object(Bucket=info.name, Key="keep/me.txt")["Body"].read() == b"precious"
    st = json.loads(kit.glue("status", "--json").stdout)
    assert st["vms"] == [] and st["bucket"]["reachable"]


# `stress` (make test-all): make test refuses gpukit-1's changed host key the same way on the cluster of
# test_up_ssh_isolation_replace_down (above); this boots a VM of its own for it.
@pytest.mark.stress
def test_changed_host_key_is_refused(kit: Kit) -> None:
    kit.glue("up", "--vms", "1", "--no-configure")
    kh = kit.home / "ssh" / "known_hosts"
    line = kh.read_text().split()
    # Pin a different (valid) ed25519 key for the same address, as if the VM's key had changed.
    other = (kit.home / "ssh" / "id_ed25519.pub").read_text().split()
    kh.write_text(f"{line[0]} {other[0]} {other[1]}\n")
    res = kit.glue("ssh", "gpukit-1", "--", "true", check=False)
    assert res.returncode != 0
    assert "CHANGED" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--vms", "0"], "'--vms': 0 is not in the range 1<=x<=16"),
        (["--vms", "17"], "'--vms': 17 is not in the range 1<=x<=16"),
        (["--name-prefix", "Bad_Prefix"], "'Bad_Prefix': 2-32 lowercase letters, digits and dashes"),
    ],
)
def test_bad_vm_count_or_prefix_is_refused_before_terraform(kit: Kit, args: list[str], needle: str) -> None:
    res = kit.glue("up", "--no-configure", *args, check=False)
    assert res.returncode != 0
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (kit.home / "vms").exists() or list((kit.home / "vms").iterdir()) == []


@pytest.mark.parametrize(("vms", "prefix", "needle"), [(0, "gpukit", "vm_count must be a whole number from 1 to 16"),
                                                        (2, "Bad_Prefix", "name_prefix must be 2-32 characters")])
def test_the_terraform_module_validates_its_variables_too(kit: Kit, vms: int, prefix: str, needle: str) -> None:
    """For whoever drives terraform/ without glue: the module's own validation blocks."""
    from rich.console import Console

    from glue.cluster.current import ClusterConfig, tf_vars
    from glue.errors import GlueError
    from glue.infra.terraform import Terraform

    tf = Terraform(kit.home, "local", Console(stderr=True))
    with pytest.raises(GlueError, match=needle), tf.locked():
        tf.apply(tf_vars(kit.home, ClusterConfig(vms=vms, name_prefix=prefix)))
    assert not (kit.home / "vms").exists() or list((kit.home / "vms").iterdir()) == []


def test_terraform_missing_is_one_clear_line(kit: Kit) -> None:
    env = {**kit.env, "PATH": "/nonexistent"}
    res = kit.glue("up", "--no-configure", check=False, env=env)
    assert res.returncode != 0
    assert "terraform is not on PATH" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_no_namespace_privilege_is_one_clear_line(kit: Kit) -> None:
    import subprocess
    import sys

    res = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps=-sys_admin",
         sys.executable, "-m", "glue.cli", "up", "--no-configure"],
        env=kit.env, capture_output=True, text=True, timeout=120,
    )
    assert res.returncode != 0
    assert "cannot create a mount namespace" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (kit.home / "vms").exists()


"""Expiring Lyceum bucket credentials reach the VMs: the trainer's file and the /mnt/s3 mount's
rclone config follow every refresh, and rclone on the VM keeps reaching the bucket across expiries.
Expiry without waiting on the clock (as in tests/unit/test_lyceum_storage.py): the emulator ends the
session, and the stored copy is aged past its expiry as time would age it."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.lyceum.api import LyceumClient
from glue.cloud.lyceum.backend import LyceumBackend
from glue.cluster import current
from glue.cluster.credentials import MOUNT_SCRIPT, RCLONE_CONF, TRAINER_FILE, push_if_refreshed
from glue.infra import ssh
from tests.lyceum_emulator import Emulator

from .conftest import Kit

pytestmark = pytest.mark.integration
TTL = 600.0  # never near expiry by the clock here (margin TTL/4): the test expires them
RCLONE = "rclone"  # the VM's own (the emulator's VMs boot the gpukit image: /usr/local/bin/rclone)


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.2, credentials_ttl=TTL) as emulator:
        yield emulator


def test_vm_copies_follow_refreshed_credentials(kit: Kit, emu: Emulator) -> None:
    env = {**kit.env, **emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu", "LYCEUM_POLL_INTERVAL": "0.2"}
    kit.glue("up", "--backend", "lyceum", "--vms", "1", "--no-configure", env=env)
    [host] = current.hosts(kit.home)
    backend = LyceumBackend(kit.home, client=LyceumClient(emu.api_key, emu.url))
    info = backend.bucket()

    def vm(cmd: str) -> ssh.CommandResult:
        return ssh.run(kit.home, host, cmd, timeout=60)

    # What the bucket_mount role leaves on a VM (stale credentials), and a mount script that logs reloads.
    conf = (f"[gpukit]\ntype = s3\nprovider = Other\naccess_key_id = OLD\nsecret_access_key = OLD\n"
            f"endpoint = {info.endpoint}\nregion = us-east-1\nforce_path_style = true\n")
    vm(f"mkdir -p /etc/gpukit && umask 077 && printf %s {shlex.quote(conf)} > {RCLONE_CONF}")
    vm(f"printf '#!/bin/sh\\necho \"$1\" >> /root/reloads\\n' > {MOUNT_SCRIPT} && chmod +x {MOUNT_SCRIPT}")
    lsf = f"{RCLONE} --config {RCLONE_CONF} lsf gpukit:{info.name} --low-level-retries 1 --retries 1"
    assert vm(lsf).exit_code != 0

    assert push_if_refreshed(kit.home, [host], backend) == {"gpukit-1": "updated"}
    first = json.loads(vm(f"cat {TRAINER_FILE}").stdout)
    assert first["session_token"] == json.loads((kit.home / "bucket" / "credentials.json").read_text())["session_token"]
    assert vm(f"stat -c %a {RCLONE_CONF} {TRAINER_FILE}").stdout.split() == ["600", "600"]
    assert f"session_token = {first['session_token']}" in vm(f"cat {RCLONE_CONF}").stdout
    assert vm(lsf).exit_code == 0, vm(lsf).stderr
    assert push_if_refreshed(kit.home, [host], backend) == {}  # nothing changed: nothing pushed

    # The pushed credentials expire: rclone on the VM is refused ...
    emu.sts.expire_all()
    cred_file = kit.home / "bucket" / "credentials.json"
    cred_file.write_text(json.dumps({**json.loads(cred_file.read_text()), "expires_at": time.time() - 1}))
    assert vm(lsf).exit_code != 0 and "ExpiredToken" in emu.sts.rejections
    assert push_if_refreshed(kit.home, [host], backend) == {"gpukit-1": "updated"}
    second = json.loads(vm(f"cat {TRAINER_FILE}").stdout)
    assert second["session_token"] != first["session_token"]
    assert vm(lsf).exit_code == 0  # ... and works again with the refreshed ones
    assert vm("cat /root/reloads").stdout.split() == ["reload", "reload"]
    text = vm(f"cat {RCLONE_CONF}").stdout
    assert text.count("session_token") == 1 and "OLD" not in text and "force_path_style = true" in text
    kit.glue("down", env=env)

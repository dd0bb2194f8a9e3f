"""A module's VM with `host_key = ""` (most providers cannot read it): its key is read from the VM right after
the apply, its fingerprint shown and recorded by VM id, and from then on taken from the record without asking
the VM again; a replaced VM (a new id) is read again, and one that never answers is one line."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

from glue.cloud.ssh import remote
from glue.cloud.terraform import hostkeys
from glue.errors import GlueError


class _Server(paramiko.ServerInterface):
    pass


def _sshd(key: paramiko.PKey) -> socket.socket:
    """A loopback SSH server that presents `key` (no login: the key exchange is all a key read needs)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            try:
                transport.start_server(server=_Server())
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _vm(vm_id: str, port: int) -> dict[str, Any]:
    return {"id": vm_id, "ssh_host": "127.0.0.1", "ssh_port": port, "ssh_user": "root", "host_key": "",
            "gpu_type": "none", "gpu_count": 0, "market": "", "backend": "terraform"}


def test_an_empty_host_key_is_trusted_on_first_use_and_recorded(tmp_path: Path) -> None:
    key = paramiko.RSAKey.generate(2048)
    line = f"{key.get_name()} {key.get_base64()}"
    srv = _sshd(key)
    port = srv.getsockname()[1]
    said: list[str] = []
    vms = {"gpukit-1": _vm("i-1", port)}
    hostkeys.fill(tmp_path, vms, 10.0, said.append)
    assert vms["gpukit-1"]["host_key"] == line
    assert len(said) == 1 and said[0].startswith(f"gpukit-1: host key ssh-rsa {remote.fingerprint(line)} at "
                                                 f"127.0.0.1:{port} trusted on first use")
    pins = json.loads((tmp_path / "user-module" / "host_keys.json").read_text())
    assert pins["i-1"]["key"] == line and pins["i-1"]["fingerprint"] == remote.fingerprint(line)
    srv.shutdown(socket.SHUT_RDWR)  # wakes the accept: the server is gone
    srv.close()

    # Later reads take the recorded key; the VM is not asked again (its server is gone now).
    again = {"gpukit-1": _vm("i-1", port)}
    hostkeys.fill(tmp_path, again, None, said.append)
    assert again["gpukit-1"]["host_key"] == line and len(said) == 1

    # A replaced VM is a new id: nothing recorded for it, and read on first use again, or one line.
    new = {"gpukit-1": _vm("i-2", port)}
    hostkeys.fill(tmp_path, new, None, said.append)
    assert new["gpukit-1"]["host_key"] == ""
    with pytest.raises(GlueError) as exc:
        hostkeys.fill(tmp_path, new, 0.0, said.append)
    assert f"gpukit-1: unreachable at 127.0.0.1:{port}" in str(exc.value) and "\n" not in str(exc.value)
    assert "its host key is read on first use" in str(exc.value)

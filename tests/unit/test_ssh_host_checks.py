"""`glue up --backend ssh`'s host checks against a real sshd on 127.0.0.1 that lets nobody log in (its
host key is all these checks need of it): a new key is refused without --accept-new-host-keys (its
fingerprint shown), pinned with it; a changed key is refused; an unreachable host and a host that refuses
the login are one line each; nothing is written for the provider when a host fails."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.ssh import hosts, remote, setup, state
from glue.errors import GlueError

SSHD = Path("/usr/sbin/sshd")
pytestmark = pytest.mark.skipif(not SSHD.exists(), reason="needs openssh-server (make bootstrap installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sshd:
    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp, self.port = tmp, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, key_name: str) -> str:
        """sshd with a host key of its own (made once per name); returns the public key line."""
        key = self.tmp / key_name
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        cfg = self.tmp / "sshd_config"
        cfg.write_text(f"ListenAddress 127.0.0.1:{self.port}\nHostKey {key}\nAuthorizedKeysFile /nonexistent\n"
                       "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                       f"PidFile {self.tmp / 'sshd.pid'}\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(8).startswith(b"SSH-"):
                        break
            except OSError:
                time.sleep(0.05)
        return " ".join(key.with_suffix(".pub").read_text().split()[:2])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    server = Sshd(tmp_path, _free_port())
    yield server
    server.stop()


def _file(tmp_path: Path, port: int, name: str = "box") -> Path:
    ident = tmp_path / "id_user"
    if not ident.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ident)], check=True)
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  - name: {name}\n    address: 127.0.0.1\n    port: {port}\n"
                    f"    identity_file: {ident}\n")
    return path


def _prepare(home: Path, path: Path, accept: bool, lines: list[str]) -> None:
    setup.prepare(home, path, (1, 0), setup.Asking(accept, None), lines.append)


def test_a_new_host_key_is_refused_without_the_flag_and_pinned_with_it(tmp_path: Path, sshd: Sshd) -> None:
    key = sshd.start("key1")
    home = tmp_path / "home"
    path = _file(tmp_path, sshd.port)
    lines: list[str] = []
    with pytest.raises(GlueError, match="box failed the checks"):
        _prepare(home, path, False, lines)
    assert len(lines) == 1 and "new host key ssh-ed25519 " + remote.fingerprint(key) in lines[0]
    assert "--accept-new-host-keys" in lines[0] and lines[0].startswith("FAIL ")
    assert state.read(home).pins == {} and hosts.read_snapshot(home) == []

    lines.clear()
    with pytest.raises(GlueError, match="box failed the checks"):  # pinned, then the login is refused
        _prepare(home, path, True, lines)
    assert state.read(home).pins == {"box": key}
    assert len(lines) == 1 and "root@127.0.0.1:" in lines[0] and "refused the key" in lines[0]
    assert hosts.read_snapshot(home) == []  # nothing for the provider to take


def test_a_changed_host_key_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    first = sshd.start("key1")
    home = tmp_path / "home"
    with state.changing(home) as st:
        st.pins["box"] = first
    sshd.stop()
    now = sshd.start("key2")  # the same address, another machine (or a reinstall)
    lines: list[str] = []
    with pytest.raises(GlueError):
        _prepare(home, _file(tmp_path, sshd.port), True, lines)
    assert len(lines) == 1 and "CHANGED since it was pinned" in lines[0]
    assert remote.fingerprint(first) in lines[0] and remote.fingerprint(now) in lines[0]
    assert state.read(home).pins == {"box": first}  # --accept-new-host-keys never replaces a pin


def test_an_unreachable_host_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lines: list[str] = []
    with pytest.raises(GlueError) as err:
        _prepare(home, _file(tmp_path, _free_port(), name="gone"), True, lines)
    assert len(lines) == 1 and "gone: unreachable at 127.0.0.1:" in lines[0] and "refused" in lines[0].lower()
    assert "\n" not in str(err.value) and "nothing was configured" in str(err.value)

"""glue watch's probe asks over the connection it held while the heartbeat was on time, against a real sshd
on 127.0.0.1: a VM whose sshd takes no new connection in time (a loaded host, a slow bastion) still answers
over it, where a probe with only new connections calls it silent; a frozen VM is silent at the deadline
though a connection was held."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.infra.inventory import Host, known_hosts_path
from glue.infra.ssh_keys import client_key
from glue.watch import ssh_probe
from glue.watch.ssh_probe import Probe
from tests.unit.test_ssh_host_checks import SSHD, Sshd, _free_port

pytestmark = pytest.mark.skipif(not SSHD.exists(), reason="needs openssh-server (make bootstrap installs it)")


class LoginSshd(Sshd):
    """The host checks' sshd, letting root in with the kit home's client key."""

    def start_for(self, home: Path) -> str:
        public = self.start("host")  # writes its config, which this one extends
        self.stop()
        cfg = self.tmp / "sshd_config"
        keys = self.tmp / "authorized_keys"
        keys.write_text(Path(f"{client_key(home)}.pub").read_text())
        cfg.write_text(cfg.read_text().replace("AuthorizedKeysFile /nonexistent", f"AuthorizedKeysFile {keys}")
                       + "PermitRootLogin prohibit-password\nStrictModes no\n")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _banner(self.port):
            assert time.monotonic() < deadline, "sshd did not start"
            time.sleep(0.05)
        return public

    def signal_all(self, sig: signal.Signals) -> None:
        """The listener and every session process it started."""
        assert self.proc is not None
        kids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in [self.proc.pid, *map(int, kids)]:
            os.kill(pid, sig)


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[tuple[Path, Host, LoginSshd]]:
    home = tmp_path / "home"
    client_key(home)
    server = LoginSshd(tmp_path, _free_port())
    public = server.start_for(home)
    known_hosts_path(home).write_text(f"[127.0.0.1]:{server.port} {public}\n")
    host = Host(name="vm-1", id="vm-1-held", ssh_host="127.0.0.1", ssh_port=server.port, ssh_user="root",
                host_key=public, gpu_type="none", gpu_count=0, backend="local")
    yield home, host, server
    server.signal_all(signal.SIGCONT)
    server.stop()


def _verdict(probe: Probe) -> tuple[str, float]:
    while probe.verdict(time.time()) == "pending":
        time.sleep(0.02)
    return probe.verdict(time.time()), time.time()


def _held(home: Path, host: Host) -> None:
    ssh_probe.hold(home, host)
    deadline = time.monotonic() + 20
    while not ssh_probe.is_held(home, host):
        assert time.monotonic() < deadline, "no connection was held"
        time.sleep(0.05)


def test_a_vm_that_takes_no_new_connection_answers_over_the_held_one(vm: tuple[Path, Host, LoginSshd]) -> None:
    home, host, server = vm
    _held(home, host)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)  # the listener: new connections wait for a banner that never comes
    t0 = time.time()
    verdict, _ = _verdict(Probe(home, host, beat_at=t0 - 2, deadline=t0 + 2.0))
    assert verdict == "answered"
    assert ssh_probe.is_held(home, host)  # kept for the next late heartbeat
    # The same VM as another kit home sees it, without a held connection: only new ones, none answers.
    other = home.parent / "other"
    known_hosts_path(other).write_text(known_hosts_path(home).read_text())
    client_key(other)
    t0 = time.time()
    assert _verdict(Probe(other, host, beat_at=t0 - 2, deadline=t0 + 1.0))[0] == "silent"


def test_a_frozen_vm_is_silent_at_the_deadline_though_a_connection_was_held(
        vm: tuple[Path, Host, LoginSshd]) -> None:
    home, host, server = vm
    _held(home, host)
    server.signal_all(signal.SIGSTOP)  # the whole VM stops answering, on every connection
    t0 = time.time()
    verdict, at = _verdict(Probe(home, host, beat_at=t0 - 2, deadline=t0 + 1.5))
    assert verdict == "silent" and 1.5 <= at - t0 < 1.8, at - t0

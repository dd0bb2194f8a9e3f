"""glue watch's SSH probe of a VM whose heartbeat is late: its window, and a VM that does not answer
(sshd frozen: the kernel accepts the connection, no banner comes; sshd dead: refused)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.infra.inventory import Host, known_hosts_path
from glue.watch.ssh_probe import Probe, window


@pytest.mark.parametrize(("heartbeat", "lost_after"), [(1, 5), (2, 5), (2, 3), (0.5, 1), (60, 600)])
def test_the_window_opens_after_a_late_heartbeat_and_closes_before_lost_after(heartbeat: float,
                                                                                lost_after: float) -> None:
    for margin in (0.1, 1.5, 3.0, 100.0):
        probe_from, decide_at = window(heartbeat, lost_after, margin)
        assert heartbeat < probe_from < decide_at < lost_after
        assert decide_at - probe_from >= min(1.0, (lost_after - heartbeat) / 4)  # time to answer


def test_window_of_the_defaults() -> None:
    assert window(2, 5) == (2.25, 3.5)  # a 1.25 s window, the verdict 1.5 s before lost_after
    assert window(1, 5) == (1.25, 3.5)
    assert window(2, 5, margin_s=2.5) == (2.25, 3.25)  # a slow bucket: the window shrinks, never below 1 s


@pytest.fixture
def home(tmp_path: Path) -> Path:
    known_hosts_path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    known_hosts_path(tmp_path).write_text("")
    return tmp_path


@pytest.fixture
def frozen_sshd() -> Iterator[int]:
    """A listening socket that never accepts: connections complete in the kernel's backlog, then nothing."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def _host(port: int) -> Host:
    return Host(name="vm-1", id="vm-1-abcd", ssh_host="127.0.0.1", ssh_port=port, ssh_user="root",
                host_key="ssh-ed25519 AAAA", gpu_type="none", gpu_count=0, backend="local")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["frozen", "refused"])
def test_a_vm_that_does_not_answer_is_silent_when_the_window_closes_not_later(home: Path, frozen_sshd: int,
                                                                              kind: str) -> None:
    port = frozen_sshd if kind == "frozen" else _closed_port()
    t0 = time.time()
    probe = Probe(home, _host(port), beat_at=t0 - 2, deadline=t0 + 1.0)
    assert probe.verdict(time.time()) == "pending"
    while probe.verdict(time.time()) == "pending":
        time.sleep(0.02)
    took = time.time() - t0
    assert probe.verdict(time.time()) == "silent" and probe.answered_at is None
    assert 1.0 <= took < 1.2  # the verdict comes at the deadline, not after a connect timeout
    assert probe.tries >= (1 if kind == "frozen" else 3)  # a refused connection is tried again

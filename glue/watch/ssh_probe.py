"""Is a VM whose heartbeat went late still there? An SSH probe started as soon as the heartbeat is late,
so a VM the backend still reports running but that no longer answers (frozen, its sshd dead, its
network gone) is known lost by `monitor.lost_after_seconds` after its last heartbeat, not a probe
timeout later.

The timeline of one heartbeat (t = its `updated_at`, h = heartbeat_seconds, L = lost_after_seconds):

  t .. t+probe_from      on time: running, no SSH
  t+probe_from ..        late: a probe in the background tries SSH (connect, `true`) again and again
                         until it answers or t+decide_at passes
  answered               the VM is there: running until t+L, then the monitor's full check decides
                         (running, stall, killed, ...), as for any heartbeat older than L
  t+decide_at, silent    SSH did not answer for the whole window: the full check classifies the VM lost
                         without trying SSH again (decide_at leaves a margin for it before t+L: 1.5 s, or
                         more when the watcher measured its checks slower)

A trainer that is slow but alive keeps its heartbeat (a thread of its own), so no probe starts; a
late heartbeat on a VM that answers SSH is never called lost here.

The probe asks first over a connection the watcher opened while the heartbeat was on time (`hold`), one per
VM, kept alive: on a loaded controller or behind a bastion a new SSH connection (two handshakes there) can
take longer than the whole window, and a VM that was merely slow to shake hands was once called lost
(CI, 2026-12-07: a run classed vm_lost 0.5 s before its closing heartbeat). A frozen VM answers on no
connection, held or new; one the held connection does not answer within half the time left is tried
over a new one too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs.records import AttemptNode

DECIDE_MARGIN_S = 1.5   # at least this for the full check (bucket reads, the incident) after the window closes
LATE_SLACK_S = 0.25     # a heartbeat this much past its period is late (its upload takes a moment)
MIN_WINDOW_S = 1.0      # the probe's window is never shorter (nor longer than half the time left)
RETRY_S = 0.25          # between tries of a probe whose connection was refused or broke
KEEPALIVE_S = 15.0      # a held connection's keepalive: no firewall or NAT drops it while idle

_held: dict[str, paramiko.SSHClient] = {}  # the watcher's open connection per VM (`hold`), idle between probes
_opening: set[str] = set()
_of_vm: dict[str, str] = {}  # "<home>|<vm id>" -> its held connection's key: no inventory read while held
_lock = threading.Lock()


def _key(home: Path, host: Host) -> str:
    return f"{home}|{host.id}|{host.ssh_host}:{host.ssh_port}"


def hold(home: Path, host: Host) -> None:
    """Open, in the background, the connection the probes of `host` ask over first (once; again after one
    broke)."""
    key = _key(home, host)
    with _lock:
        if key in _held or key in _opening:
            return
        _opening.add(key)
    threading.Thread(target=_open_held, args=(home, host, key), name=f"gpukit-hold-{host.name}", daemon=True).start()


def hold_for(home: Path, node: AttemptNode) -> None:
    """`hold` for an attempt's VM, called on every on-time poll: the inventory is read only while no connection
    is held (or opening) for it."""
    vm = f"{home}|{node.vm_id}"
    with _lock:
        key = _of_vm.get(vm)
        if key is not None and (key in _held or key in _opening):
            return
    host = current.host_of_node(home, node)
    if host is not None:
        with _lock:
            _of_vm[vm] = _key(home, host)
        hold(home, host)


def is_held(home: Path, host: Host) -> bool:
    with _lock:
        return _key(home, host) in _held


def _open_held(home: Path, host: Host, key: str) -> None:
    try:
        _give_back(key, ssh.connect(home, host))
    except (GlueError, paramiko.SSHException, OSError, EOFError):
        pass  # no connection held: a probe connects anew, as it always could
    finally:
        with _lock:
            _opening.discard(key)


def _take(key: str) -> paramiko.SSHClient | None:
    with _lock:
        client = _held.pop(key, None)
    transport = client.get_transport() if client is not None else None
    if client is not None and (transport is None or not transport.is_active()):
        client.close()
        return None
    return client


def _give_back(key: str, client: paramiko.SSHClient) -> None:
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(int(KEEPALIVE_S))
    with _lock:
        old, _held[key] = _held.get(key), client
    if old is not None and old is not client:
        old.close()


def window(heartbeat_s: float, lost_after_s: float, margin_s: float = DECIDE_MARGIN_S) -> tuple[float, float]:
    """(probe_from, decide_at): seconds after a heartbeat's `updated_at` when a probe starts, and when a
    probe that has not been answered makes the VM lost; `margin_s` before lost_after_s is left for the
    full check (the watcher passes more when it measured its checks slower). Both before lost_after_s."""
    probe_from = min(heartbeat_s + LATE_SLACK_S, (heartbeat_s + lost_after_s) / 2)
    least = probe_from + min(MIN_WINDOW_S, (lost_after_s - probe_from) / 2)
    return probe_from, max(lost_after_s - max(margin_s, DECIDE_MARGIN_S), least)


@dataclass
class Probe:
    """SSH to `host` from now until `deadline` (epoch seconds) or until it answers, in a daemon thread."""

    home: Path
    host: Host
    beat_at: float  # the heartbeat this probe is about (its updated_at, epoch seconds)
    deadline: float
    started_at: float = field(default_factory=time.time)
    answered_at: float | None = None
    tries: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        threading.Thread(target=self._run, name=f"gpukit-probe-{self.host.name}", daemon=True).start()

    def _run(self) -> None:
        key = _key(self.home, self.host)
        while (left := self.deadline - time.time()) > 0:
            self.tries += 1
            held = _take(key)
            client = held
            try:
                if client is None:
                    client = ssh.connect(self.home, self.host, timeout=max(left, 0.1))
                # A held connection gets half the time left: one that broke silently must leave time for a new one.
                if self._answers(client, self.deadline - (left / 2 if held is not None else 0)):
                    self.answered_at = time.time()
                    _give_back(key, client)
                    return
            except (GlueError, paramiko.SSHException, OSError, EOFError) as exc:
                self.last_error = str(exc)
            if client is not None:
                client.close()
            if held is None:
                time.sleep(min(RETRY_S, max(self.deadline - time.time(), 0)))

    def _answers(self, client: paramiko.SSHClient, until: float) -> bool:
        """`true` ran and exited 0 on the VM over `client` before `until` and before the deadline."""
        transport = client.get_transport()
        if transport is None:
            raise EOFError("no transport")
        chan = transport.open_session(timeout=max(until - time.time(), 0.1))
        try:
            chan.exec_command(ssh.as_root(self.host, "true"))
            done = chan.status_event.wait(max(until - time.time(), 0.05))
            return done and chan.recv_exit_status() == 0 and time.time() <= self.deadline
        finally:
            chan.close()  # the held connection carries the next probe's channel, not this one's

    def verdict(self, now: float) -> str:
        """answered | silent (the window passed without an answer) | pending."""
        if self.answered_at is not None:
            return "answered"
        return "silent" if now >= self.deadline else "pending"

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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host

DECIDE_MARGIN_S = 1.5   # at least this for the full check (bucket reads, the incident) after the window closes
LATE_SLACK_S = 0.25     # a heartbeat this much past its period is late (its upload takes a moment)
MIN_WINDOW_S = 1.0      # the probe's window is never shorter (nor longer than half the time left)
RETRY_S = 0.25          # between tries of a probe whose connection was refused or broke


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
        while (left := self.deadline - time.time()) > 0:
            self.tries += 1
            try:
                client = ssh.connect(self.home, self.host, timeout=max(left, 0.1))
                try:
                    transport = client.get_transport()
                    if transport is None:
                        raise EOFError("no transport")
                    chan = transport.open_session(timeout=max(self.deadline - time.time(), 0.1))
                    chan.exec_command(ssh.as_root(self.host, "true"))
                    done = chan.status_event.wait(max(self.deadline - time.time(), 0.05))
                    if done and chan.recv_exit_status() == 0 and time.time() <= self.deadline:
                        self.answered_at = time.time()
                        return
                finally:
                    client.close()
            except (GlueError, paramiko.SSHException, OSError, EOFError) as exc:
                self.last_error = str(exc)
            time.sleep(min(RETRY_S, max(self.deadline - time.time(), 0)))

    def verdict(self, now: float) -> str:
        """answered | silent (the window passed without an answer) | pending."""
        if self.answered_at is not None:
            return "answered"
        return "silent" if now >= self.deadline else "pending"

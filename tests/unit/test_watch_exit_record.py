"""An attempt whose supervisor wrote its exit record is over on that node, even while the supervisor
process lingers (seen in the credentials soak: its interpreter took 15 s+ to exit, the heartbeat step
aged past the stall timeout, and the finished run was classified a stall and killed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from glue.cluster import current
from glue.infra.inventory import Host
from glue.runs import monitor
from glue.runs.classify import AttemptClass, Evidence, classify
from glue.runs.records import AttemptNode

HOST = Host(name="gpukit-1", id="gpukit-1-a", ssh_host="127.0.0.1", ssh_port=2201, ssh_user="root",
            host_key="ssh-ed25519 A", gpu_type="none", gpu_count=0, backend="local")


class Store:
    def __init__(self, exit_rec: dict[str, Any] | None) -> None:
        self.exit_rec = exit_rec
        self.run = "r"

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        return self.exit_rec if (n, node) == (1, 0) else None


class Backend:
    def read_vm(self, vm_id: str) -> object:
        return object()


@pytest.mark.parametrize(("exit_rec", "supervisor", "trainer", "alive"), [
    ({"exit_code": 0, "signal": None}, "S", "gone", False),   # exit written, the supervisor still exiting
    ({"exit_code": 0, "signal": None}, "gone", "gone", False),
    (None, "S", "gone", True),                                # no exit record yet: the supervisor is at work
    (None, "S", "R", True),
])
def test_an_exit_record_ends_the_attempt_on_its_node(monkeypatch: pytest.MonkeyPatch, exit_rec: dict[str, Any] | None,
                                                     supervisor: str, trainer: str, alive: bool) -> None:
    monkeypatch.setattr(current, "host_of_node", lambda home, nd: HOST)
    monkeypatch.setattr(monitor.ssh, "reachable", lambda home, host: True)
    monkeypatch.setattr(monitor.remote, "process_state",
                        lambda home, host, run, n: {"trainer": trainer, "supervisor": supervisor, "pids": {}})
    st = monitor._node_state(Path("/nonexistent"), Store(exit_rec), 1, Backend(),  # type: ignore[arg-type]
                             AttemptNode(node=0, vm="gpukit-1", vm_id="gpukit-1-a"))
    assert st.alive is alive
    if exit_rec is not None:
        ev = Evidence(heartbeat_age_s=22.0, stall_timeout_s=20.0, heartbeat_step=3000)
        monitor.combine(ev, [st], [], [], None)
        assert classify(ev).outcome is AttemptClass.COMPLETED  # not a stall of the finished trainer

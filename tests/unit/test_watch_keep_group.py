"""--keep-failed for a multi-node group: every live VM of the failed attempt is kept (frozen, released
from Terraform's state, new VMs under the same names), `glue status` lists them, `glue up` spares them
and `glue down` removes them. The recovery phases with the backend, terraform and SSH stood in for."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from glue.infra.inventory import Host
from glue.infra.terraform import vm_address
from glue.operations import lifecycle
from glue.operations.recovery import phases
from glue.runs.classify import AttemptClass

NODES = [{"node": 0, "vm": "gpukit-1", "vm_id": "gpukit-1-old"}, {"node": 1, "vm": "gpukit-2", "vm_id": "gpukit-2-old"}]


def _host(name: str, vm_id: str, port: int) -> Host:
    return Host(name=name, id=vm_id, ssh_host="127.0.0.1", ssh_port=port, ssh_user="root", host_key="ssh-ed25519 A",
                gpu_type="none", gpu_count=0, backend="local")


class Backend:
    def __init__(self, live: set[str]) -> None:
        self.live, self.deleted = set(live), []  # type: ignore[var-annotated]

    def read_vm(self, vm_id: str) -> object | None:
        return object() if vm_id in self.live else None

    def owned_vm_ids(self) -> list[str]:
        return sorted(self.live)

    def delete_vm(self, vm_id: str) -> None:
        self.deleted.append(vm_id)
        self.live.discard(vm_id)


class Tf:
    calls: list[tuple[str, Any]] = []

    def __init__(self, *args: Any) -> None:
        pass

    @contextmanager
    def locked(self) -> Iterator[None]:
        yield

    def state_rm(self, address: str) -> None:
        Tf.calls.append(("state_rm", address))

    def apply(self, tf_vars: Any, replace: list[str] | None = None, destroy: bool = False) -> None:
        Tf.calls.append(("apply", replace or []))

    def outputs(self) -> dict[str, Any]:
        return {"vms": {}}


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Backend:
    backend = Backend({"gpukit-1-old", "gpukit-2-old"})
    old = {nd["vm_id"]: _host(str(nd["vm"]), str(nd["vm_id"]), 2201 + k) for k, nd in enumerate(NODES)}
    monkeypatch.setattr(phases.current.ClusterConfig, "load", classmethod(lambda cls, home: cls()))
    monkeypatch.setattr(phases, "get_backend", lambda name, home: backend)
    monkeypatch.setattr(lifecycle, "get_backend", lambda name, home: backend)
    monkeypatch.setattr(phases.monitor, "host_for", lambda home, nd: old.get(str(nd.get("vm_id"))))
    Tf.calls = []
    monkeypatch.setattr(phases, "Terraform", Tf)
    monkeypatch.setattr(phases.current, "tf_vars", lambda home, cfg: {})
    monkeypatch.setattr(phases.inventory, "write", lambda home, outputs, also_known=(): [])
    monkeypatch.setattr(phases.current, "host", lambda home, name: _host(name, f"{name}-new", 2300))
    return backend


def _failure(outcome: AttemptClass) -> phases.Failure:
    attempt = {"run": "g", "attempt": 3, "nodes": NODES, "vm": "gpukit-1", "vm_id": "gpukit-1-old"}
    return phases.Failure(outcome, 3, attempt, {}, None, "2026-01-01T00:00:00.000000Z")


def test_every_live_vm_of_a_failed_group_is_kept(group: Backend, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert phases.keepable(tmp_path, _failure(AttemptClass.COMM), keep_failed=False) == []
    assert phases.keepable(tmp_path, _failure(AttemptClass.VM_LOST), keep_failed=True) == []  # nothing alive to debug
    keep = phases.keepable(tmp_path, _failure(AttemptClass.COMM), keep_failed=True)
    assert [(k.name, k.id, k.run, k.attempt, k.failure_class) for k in keep] == [
        ("gpukit-1", "gpukit-1-old", "g", 3, "comm"), ("gpukit-2", "gpukit-2-old", "g", 3, "comm")]

    # What is left of the attempt is frozen (SIGSTOP), not killed, on every kept node.
    commands: list[tuple[str, str]] = []
    killed: list[str] = []
    monkeypatch.setattr(phases.ssh, "reachable", lambda home, host: True)
    monkeypatch.setattr(phases.remote, "process_state",
                        lambda home, host, run, n: {"pids": {"supervisor_pid": 10, "trainer_pid": 11}})
    monkeypatch.setattr(phases.ssh, "run", lambda home, host, cmd, timeout=0: commands.append((host.name, cmd)))
    monkeypatch.setattr(phases.remote, "kill_attempt", lambda home, host, run, n: killed.append(host.name))
    store = SimpleNamespace(run="g")
    phases.kill_attempt(tmp_path, store, _failure(AttemptClass.COMM).attempt, freeze=keep)  # type: ignore[arg-type]
    assert [h for h, _ in commands] == ["gpukit-1", "gpukit-2"] and killed == []
    assert all("kill -STOP" in c and "10 11" in c for _, c in commands)

    # Both leave Terraform's state; the apply creates new VMs under the same names (nothing -replace'd).
    hosts, replaced = phases.provision(tmp_path, Console(file=io.StringIO()), NODES, same_vm=False, keep=keep)
    assert Tf.calls == [("state_rm", vm_address("gpukit-1")), ("state_rm", vm_address("gpukit-2")), ("apply", [])]
    assert replaced == ["gpukit-1", "gpukit-2"] and [h.id for h in hosts] == ["gpukit-1-new", "gpukit-2-new"]

    # glue status lists both; glue up spares them; glue down removes them.
    assert [k.id for k in lifecycle.kept(tmp_path)] == ["gpukit-1-old", "gpukit-2-old"]
    spare = {k.id for k in lifecycle.kept(tmp_path)}
    assert lifecycle.remove_orphans(tmp_path, "local", {"vms": {}}, Console(file=io.StringIO()), spare=spare) == []
    removed = lifecycle.remove_orphans(tmp_path, "local", {"vms": {}}, Console(file=io.StringIO()))
    assert removed == ["gpukit-1-old", "gpukit-2-old"] and group.deleted == removed
    assert lifecycle.kept(tmp_path) == []


def test_a_group_node_already_gone_is_not_kept(group: Backend, tmp_path: Path) -> None:
    group.live.discard("gpukit-2-old")
    keep = phases.keepable(tmp_path, _failure(AttemptClass.STALL), keep_failed=True)
    assert [k.id for k in keep] == ["gpukit-1-old"]

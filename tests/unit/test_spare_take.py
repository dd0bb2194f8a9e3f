"""A recovery takes warm spares (glue.operations.spares.take): a spare that died while idle, or whose mount is
down, is never handed to a run (the recovery then provisions); a healthy one is, recorded as serving under the
lost VM's name. The whole path on local VMs: tests/e2e/test_spares.py (its dead spare in make test-all)."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from glue.cluster import spare_roles
from glue.infra.inventory import Host
from glue.operations import spares

NODE = Host(name="gpukit-1", id="old", ssh_host="127.0.0.1", ssh_port=2201, ssh_user="root", host_key="ssh-ed25519 A",
            gpu_type="none", gpu_count=0, backend="local")
SPARE = replace(NODE, name="gpukit-spare-1", id="x", ssh_port=2202, host_key="ssh-ed25519 B")


class _Backend:
    def __init__(self, alive: set[str]) -> None:
        self.alive = alive

    def read_vm(self, vm_id: str) -> object | None:
        return object() if vm_id in self.alive else None


def _take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alive: set[str],
          problems: dict[str, str] | None = None) -> tuple[list[spare_roles.Taken] | None, str, list[Host]]:
    """take() for gpukit-1 with the pool [SPARE]; returns what it took, what it said, and the spares it probed."""
    probed: list[Host] = []

    def live_problems(home: Path, vms: list[Host]) -> dict[str, str]:
        probed.extend(vms)
        return problems or {}

    monkeypatch.setattr(spares.current, "spares", lambda home: [SPARE])
    monkeypatch.setattr(spares.current, "backend", lambda home: _Backend(alive))
    monkeypatch.setattr(spares.converge, "live_problems", live_problems)
    monkeypatch.setattr(spares, "_write_inventory", lambda home: None)
    out = StringIO()
    got = spares.take(tmp_path, Console(file=out, width=300), [("gpukit-1", "old")], "r")
    return got, " ".join(out.getvalue().split()), probed


def test_a_spare_that_died_while_idle_is_never_handed_to_a_run(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    got, said, probed = _take(tmp_path, monkeypatch, alive=set())
    assert got is None and spare_roles.taken(tmp_path) == []
    assert "spare gpukit-spare-1: gone; not handed to a run (the refill replaces it)" in said, said
    assert probed == []  # a gone VM is not even asked


def test_a_spare_whose_mount_is_down_is_not_handed_either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got, said, probed = _take(tmp_path, monkeypatch, alive={"x"},
                              problems={"gpukit-spare-1": "its bucket mount is not active"})
    assert got is None and spare_roles.taken(tmp_path) == [] and probed == [SPARE]
    assert "spare gpukit-spare-1: its bucket mount is not active; not handed to a run" in said, said


def test_a_healthy_spare_is_taken_under_the_lost_vms_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got, said, probed = _take(tmp_path, monkeypatch, alive={"x"})
    assert got is not None and said == "" and probed == [SPARE]
    [entry] = got
    assert (entry.name, entry.spare, entry.id, entry.old_id, entry.run) == ("gpukit-1", "gpukit-spare-1", "x", "old",
                                                                            "r")
    assert spare_roles.taken(tmp_path) == got
    assert spare_roles.applied(tmp_path, [NODE, SPARE]) == [replace(SPARE, name="gpukit-1")]

"""bench/path_check.py: a bench stops (exit status 1, one line naming the path expected and the one taken)
when the recovery or `glue up` it measures took another path: a "seeded" recovery that ran the playbook, a
"spare" recovery that provisioned, a playbook baseline whose VMs configured themselves from the seed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from glue.operations import spares
from glue.operations.converge import Converged
from glue.operations.recovery import phases

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def pc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_path_check", BENCH / "path_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_path_check", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _record(new: str, spare: str | None = None, kept: str | None = None) -> dict[str, Any]:
    nodes = [{"node": 0, "vm": new, "replaced": True, "spare": spare}]
    if kept:
        nodes.insert(0, {"node": 0, "vm": kept, "replaced": False, "spare": None})
    return {"nodes": nodes, "new_vm": {"name": new, **({"spare": spare} if spare else {})}}


def _recover(pc: ModuleType, took: Any, made: Any, converged: Any,
             monkeypatch: pytest.MonkeyPatch) -> Any:
    """One recovery's deciding calls, as recover.py makes them (through their modules), inside watching()."""
    monkeypatch.setattr(spares, "for_recovery", lambda *a: took)
    monkeypatch.setattr(phases, "provision", lambda *a: made)
    done = Converged(list(converged), []) if converged is not None else None
    monkeypatch.setattr(phases, "configure", lambda *a: done)
    fakes = (spares.for_recovery, phases.provision, phases.configure)
    sp: Any = spares  # the fakes take any arguments
    ph: Any = phases
    with pc.watching() as seen:
        if sp.for_recovery() is None:
            ph.provision()
        if converged is not None:
            ph.configure()
    assert (spares.for_recovery, phases.provision, phases.configure) == fakes  # put back as they were
    return seen


def test_each_recovery_path_is_told_from_what_the_phases_returned(pc: ModuleType,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _recover(pc, None, ([], ["gpukit-1"]), [], monkeypatch)
    assert pc.recovery_path(seed, _record("gpukit-1")) == "seed"
    playbook = _recover(pc, None, ([], ["gpukit-1"]), ["gpukit-1"], monkeypatch)
    assert pc.recovery_path(playbook, _record("gpukit-1")) == "playbook"
    spare = _recover(pc, ([], ["gpukit-1"], {}), None, None, monkeypatch)
    assert pc.recovery_path(spare, _record("gpukit-1", spare="gpukit-spare-1")) == "spare"
    # A group keeps its live VM: only the new one counts.
    group = _recover(pc, None, ([], ["gpukit-2"]), [], monkeypatch)
    assert pc.recovery_path(group, _record("gpukit-2", kept="gpukit-1")) == "seed"


def test_a_mismatch_stops_the_bench_with_one_line(pc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    ran_playbook = _recover(pc, None, ([], ["gpukit-1"]), ["gpukit-1"], monkeypatch)
    with pytest.raises(SystemExit) as stop:
        pc.expect("seed", pc.recovery_path(ran_playbook, _record("gpukit-1")), "the recovery of bench-seed")
    assert str(stop.value.code) == "bench: the recovery of bench-seed: expected the seed path, took: playbook"
    pc.expect("playbook", pc.recovery_path(ran_playbook, _record("gpukit-1")), "the recovery of bench-rec")


def test_a_spare_that_also_provisioned_or_a_record_that_disagrees_is_not_the_spare_path(pc: ModuleType) -> None:
    both = pc.Seen(spares=["gpukit-1"], provisioned=["gpukit-1"], playbook=[])
    assert pc.recovery_path(both, _record("gpukit-1", spare="gpukit-spare-1")) == "spare, and terraform provisioned"
    taken = pc.Seen(spares=["gpukit-1"])
    assert pc.recovery_path(taken, _record("gpukit-1")).startswith("record and run disagree")
    assert pc.recovery_path(pc.Seen(), {"nodes": []}) == "no new VM"


def test_a_glue_up_path_from_what_it_said(pc: ModuleType) -> None:
    vms = ["gpukit-1", "gpukit-2"]
    playbook = "converging gpukit-1: never\nconfigured\nconverging gpukit-2: never configured\n"
    assert pc.up_path(playbook, vms) == "playbook"
    seeded = ("gpukit-1: configured itself at first boot from the\ncluster's seed (abc); no playbook\n"
              "gpukit-2: configured itself at first boot from the cluster's seed (abc); no playbook\n"
              "configuration: nothing changed on 2 VM(s) (2 configured from the seed)")
    assert pc.up_path(seeded, vms) == "seed"
    nothing = "terraform: nothing to change (2 VM(s) up)\nconfiguration: nothing changed on 2 VM(s); ..."
    assert pc.up_path(nothing, vms) == "nothing"
    half = "gpukit-1: configured itself at first boot from the cluster's seed\nconverging gpukit-2: never configured"
    assert pc.up_path(half, vms) == "gpukit-1: seed, gpukit-2: playbook"


def test_a_recovery_in_another_process_from_what_it_said(pc: ModuleType) -> None:
    log = "bench-watch: attempt 1 vm_lost: ...\ngpukit-1: configured itself at first boot from the cluster's\nseed"
    assert pc.said_path(log, "gpukit-1", _record("gpukit-1")) == "seed"
    assert pc.said_path("converging", "gpukit-1", _record("gpukit-1")).startswith("playbook")
    assert pc.said_path("", "gpukit-1", _record("gpukit-1", spare="gpukit-spare-1")) == "spare"

"""Spot VMs on Lyceum, against the emulator (real terraform, Ansible, trainer and CLI): the cluster is
created in the spot pool chosen with LYCEUM_MARKET, and a spot VM Lyceum reclaims (only its status
changes; no notice) is classed `preempted` and recovered by `glue watch` from its preemption budget,
onto a new spot VM, with the resume verified."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lyceum_emulator import Emulator

from .conftest import Kit
from .test_lyceum_e2e import lyceum_env, without_group_firewall
from .test_runs import run_config

# `stress` (make test-all): ~70 s. make test has a preempted VM recovered by `glue watch` (tests/e2e/test_watch.py)
# and the spot market's classification and pricing (tests/unit/test_classify.py, test_lyceum_backend.py).
pytestmark = [pytest.mark.integration, pytest.mark.stress]


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", pending_s=0.5) as emulator:
        yield emulator


def _run(kit: Kit, env: dict[str, str], run: str) -> dict[str, Any]:
    return dict(json.loads(kit.glue("status", "--run", run, "--json", env=env).stdout))


@pytest.mark.timeout(900)
def test_a_reclaimed_spot_vm_is_preempted_and_recovered_onto_spot(kit: Kit, emu: Emulator, tmp_path: Path) -> None:
    emu.availability_shape = "variants"
    emu.set_capacity("cpu", [], market="spot")
    env = lyceum_env(kit, emu, LYCEUM_MARKET="spot")
    without_group_firewall(kit.home)
    kit.glue("up", "--backend", "lyceum", "--vms", "1", env=env, timeout=900)
    [vm] = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
    assert vm["market"] == "spot" and emu.vms[vm["id"]].instance_type == "spot"
    assert all(body["instance_type"] == "spot" for body in emu.create_bodies)

    cfg = run_config(tmp_path, config={"steps": 80, "step_sleep": 0.1, "checkpoint_interval": 10},
                     checkpoint={"interval_steps": 10}, recovery={"max_preemptions": 1})
    kit.glue("deploy", "--run", "spot", "--config", str(cfg), env=env)
    deadline = time.monotonic() + 180
    while (_run(kit, env, "spot").get("step") or 0) < 15:
        assert time.monotonic() < deadline, _run(kit, env, "spot")
        time.sleep(1)

    emu.kill(vm["id"])  # Lyceum reclaims the spot VM: its status turns terminated, nothing else is said
    out = kit.glue("watch", "--once", "--run", "spot", env=env, timeout=600)
    said = " ".join((out.stdout + out.stderr).split())
    assert "preempted" in said, said
    incidents = json.loads(kit.glue("incidents", "--run", "spot", "--json", env=env).stdout)
    # (A save the reclaim cut short is recorded too, as ckpt_interrupted, when the kill lands in one.)
    lost = [i for i in incidents if i.get("attempt") is not None]
    assert [(i["class"], i["attempt"]) for i in lost] == [("preempted", 1)], incidents
    assert "spot VM gpukit-1 gone: reclaimed without a notice" in lost[0]["reason"], incidents
    assert "recovered onto attempt 2 (verified)" in said, said
    [new] = json.loads(kit.glue("status", "--json", env=env).stdout)["vms"]
    assert new["id"] != vm["id"] and new["market"] == "spot"
    assert [b["instance_type"] for b in emu.create_bodies] == ["spot", "spot"]
    deadline = time.monotonic() + 300
    while (st := _run(kit, env, "spot"))["state"] != "completed":
        assert time.monotonic() < deadline and st["state"] in ("running", "completed"), st
        time.sleep(2)
    kit.glue("down", env=env)
    assert emu.live_vms() == []

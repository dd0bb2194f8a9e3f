"""Warm spares: a lost VM's run continues on a spare at once (its trainer started by the spare's warm process),
the pool is refilled in the background, and a spare that died while idle is never handed to a run (the recovery
then provisions a new VM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cluster import current
from glue.infra import ssh
from glue.operations import spares
from glue.runs.store import RunStore
from glue.train import layout
from glue.train.run.start import WARM_SOCKET
from tests.e2e.test_watch import Watchers, _until
from tests.integration.test_runs import here, run_config

from .conftest import Kit

pytestmark = pytest.mark.e2e


def _status(kit: Kit) -> dict[str, Any]:
    return json.loads(here(kit).glue("status", "--json").stdout)  # in this process: polled, ~1 CPU-s as a process


def _vm(kit: Kit, role: str) -> dict[str, Any]:
    [vm] = [v for v in _status(kit)["vms"] if v["role"] == role]
    return vm


def _pool_full(kit: Kit, not_id: str, refills: int) -> dict[str, Any] | None:
    """The idle spare once the refill made one other than `not_id` and verified it ready. Asked once `refills`
    refills have ended (each logs its end), not every half second while the refill needs the CPU."""
    log = spares.log_path(kit.home)
    said = log.read_text() if log.exists() else ""
    if said.count("spare pool refilled") + said.count("spare refill failed") < refills:
        return None
    st = _status(kit)
    spare = [v for v in st["vms"] if v["role"] == "spare"]
    ok = st["spares"]["idle"] == 1 and not st["spares"]["taken"] and spare and spare[0]["id"] != not_id
    return spare[0] if ok else None


def _warm(kit: Kit, vm: str) -> bool:
    """A warm trainer process listens on `vm` (glue.train.run.warm: its socket exists once it has loaded)."""
    [host] = [h for h in current.all_hosts(kit.home) if h.name == vm]
    return ssh.run(kit.home, host, f"test -S {WARM_SOCKET}", timeout=20).exit_code == 0


def _beat(store: RunStore) -> tuple[int, int]:
    beat = store.get_json(layout.heartbeat_key(0)) or {}
    return int(beat.get("attempt") or 0), int(beat.get("step") or 0)


# The second loss, with the only spare dead while idle, is `stress` (make test-all, ~40 s more): make test hands
# no dead spare to a run (tests/unit/test_spare_take.py::test_a_spare_that_died_while_idle_is_never_handed_to_a_run)
# and has a watcher recover a run onto a new VM unattended
# (tests/e2e/test_watch.py::test_watch_recovers_unattended_within_budgets).
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dead_spare", [False, pytest.param(True, marks=pytest.mark.stress)],
                         ids=["one-loss", "then-a-dead-spare"])
def test_a_lost_vm_continues_on_a_warm_spare_and_the_pool_is_refilled(kit: Kit, tmp_path: Path,
                                                                      dead_spare: bool) -> None:
    kit.glue("up", "--vms", "1", "--spares", "1", timeout=600)
    st = _status(kit)
    assert st["spares"] == {"wanted": 1, "idle": 1, "taken": []}
    spare = _vm(kit, "spare")
    assert spare["name"] == "gpukit-spare-1" and spare["verify"]["ready"]
    res = kit.glue("up")  # spares are part of the cluster: nothing to change
    assert "terraform: nothing to change (2 VM(s) up)" in res.stderr and "nothing changed on 2 VM(s)" in res.stderr

    cfg = run_config(tmp_path, config={"steps": 400, "step_sleep": 0.05, "checkpoint_interval": 20},
                     recovery={"max_preemptions": 3, "backoff_seconds": 1, "backoff_max_seconds": 2})
    kit.glue("deploy", "--run", "sp", "--config", str(cfg), "--vm", "gpukit-1")
    store = RunStore.open(kit.home, "sp")
    backend = LocalBackend(kit.home)
    watchers = Watchers(kit, tmp_path, ["sp"])
    watchers.start()
    try:
        # Loss 1: the watcher moves the run onto the spare (no terraform, no playbook), verified; the spare's warm
        # trainer process (loaded since `glue up`) takes the attempt: no interpreter start, no imports.
        _until("step 30", lambda: _beat(store) >= (1, 30), 120)
        _until("the spare's warm trainer", lambda: _warm(kit, "gpukit-spare-1"), 120)
        backend.delete_vm(store.attempt(1)["vm_id"])
        first = _until("recovery 1", lambda: store.get_json(layout.recovery_key(1)), 240)
        assert first["verified"] and first["failure_class"] == "vm_lost", first
        assert first["new_vm"] == {"name": "gpukit-1", "id": spare["id"], "spare": "gpukit-spare-1"}
        assert store.attempt(2)["vm_id"] == spare["id"]
        assert first["seconds"]["configure"] < 1.0  # no playbook on the spare
        assert first["nodes"][0]["trainer_start"] == {"start": "warm"}, first["nodes"]
        assert "start: the trainer on gpukit-1 started warm" in watchers.logs()
        [used] = first["spares"]  # its wait is charged to the run (glue report's cost)
        assert used["spare"] == "gpukit-spare-1" and used["idle_since"] <= used["taken_at"]
        # The pool is refilled in the background: a new spare, configured and verified; the spare that took
        # over now is gpukit-1 in terraform's state too (renamed in place, not replaced).
        new_spare = _until("the pool refilled", lambda: _pool_full(kit, spare["id"], 1), 240)
        assert _vm(kit, "vm")["id"] == spare["id"]
        assert "spare pool refilled" in (kit.home / "logs" / "spares.log").read_text()
        _until("the new spare's warm trainer", lambda: _warm(kit, "gpukit-spare-1"), 120)  # re-armed

        if dead_spare:
            # Loss 2 with the only spare dead while idle: it is not handed to the run, a new VM is provisioned.
            _until("attempt 2 running on", lambda: _beat(store)[0] == 2, 120)
            backend.delete_vm(new_spare["id"])
            backend.delete_vm(spare["id"])
            second = _until("recovery 2", lambda: store.get_json(layout.recovery_key(2)), 240)
            assert second["verified"], second
            assert "spare" not in second["new_vm"] and second["new_vm"]["id"] not in (spare["id"], new_spare["id"])
            assert "spare gpukit-spare-1: gone; not handed to a run" in watchers.logs()
            _until("the pool refilled again", lambda: _pool_full(kit, new_spare["id"], 2), 240)
    finally:
        watchers.stop_all()
    kit.glue("stop", "--run", "sp", check=False)
    kit.glue("down", "--force")
    assert backend.owned_vm_ids() == [] and _status(kit)["spares"]["taken"] == []
    # A refill that got terraform's lock only after `glue down` must not bring the cluster back.
    assert spares.main([str(kit.home)]) == 0 and backend.owned_vm_ids() == []


def test_spares_bad_input(kit: Kit) -> None:
    res = kit.glue("up", "--spares", "9", check=False)
    assert res.returncode != 0 and "--spares" in res.stderr and "Traceback" not in res.stderr
    res = kit.glue("up", "--backend", "lyceum", "--spares", "1", check=False,
                   env={**kit.env, "LYCEUM_MARKET": "spot", "LYCEUM_API_KEY": "k"})
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("Error: --spares 1: this cluster's VMs are spot")
    assert not (kit.home / "terraform" / "lyceum" / "terraform.tfstate").exists()  # nothing created

"""Placement without a scheduler, on the session's 2-VM cluster: `glue deploy` puts a run on a VM no live run
uses, refuses in one line when none is free, shares a busy VM only when --vm names it; `glue recover` of a run
whose VM another live run shares moves it to a free VM and leaves the neighbour running, untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glue.cluster import current
from glue.errors import NoCapacity
from glue.runs import occupancy
from tests.integration.test_runs import here, run_config, run_objects, status, vm_exec, wait_for
from tests.kit import explain, stop_live_runs

from .conftest import Kit

pytestmark = pytest.mark.integration

CKPT = {"checkpoint": {"interval_steps": 5}}


def _attempt(kit: Kit, run: str, n: int) -> dict[str, object]:
    from glue.runs.store import RunStore

    return RunStore.open(kit.home, run).attempt(n)


def _vm_id(kit: Kit, name: str) -> str:
    return next(v["id"] for v in json.loads(kit.glue("status", "--json").stdout)["vms"] if v["name"] == name)


@pytest.mark.timeout(600)
def test_runs_go_to_free_vms_and_a_recovery_moves_off_a_shared_vm(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    stop_live_runs(fast)  # a trainer an earlier test's cleanup left running
    assert occupancy.live_on(fast.home, current.hosts(fast.home)).runs == {}
    short = run_config(tmp_path, "short.yaml", config={"steps": 3000, "step_sleep": 0.1, "checkpoint_interval": 5},
                       **CKPT)
    # The neighbour: still training long after the recovery on any host, however loaded (a 400-step one once
    # completed before the recovery came, under five lanes of tests on 2 cores).
    neighbour = run_config(tmp_path, "neighbour.yaml", config={"steps": 3000, "step_sleep": 0.1}, **CKPT)
    try:
        kit.glue("deploy", "--run", "pl-a", "--config", str(short))
        kit.glue("deploy", "--run", "pl-b", "--config", str(short))
        assert (_attempt(fast, "pl-a", 1)["vm"], _attempt(fast, "pl-b", 1)["vm"]) == ("gpukit-1", "gpukit-2")

        # A third run without --vm: no VM is free. One line, exit 1, nothing of it in the bucket.
        res = kit.glue("deploy", "--run", "pl-c", "--config", str(neighbour), check=False)
        line = res.stderr.strip()
        assert res.returncode == 1 and len(line.splitlines()) == 1 and "Traceback" not in line, res.stderr
        assert "gpukit-1 (run pl-a), gpukit-2 (run pl-b)" in line and "--vm NAME" in line, line
        assert "glue up --vms 3" in line, line
        assert run_objects(fast, "pl-c") == []
        # --vm naming a busy VM: the user shares it on purpose, and is told with whom.
        res = kit.glue("deploy", "--run", "pl-c", "--config", str(neighbour), "--vm", "gpukit-1")
        said = " ".join(res.stderr.split())
        assert "started on gpukit-1" in said and "sharing on purpose (--vm): live runs already use gpukit-1 (run " \
               "pl-a)" in said, said

        # pl-a's trainer dies; its VM is alive and pl-c lives on it. gpukit-2 is busy too: recover refuses in one
        # line before stopping or replacing anything; --same-vm on the shared VM is refused too.
        wait_for(fast, "pl-a", lambda s: (s["step"] or 0) >= 7, timeout=120)
        vm_exec(fast, "gpukit-1", "kill", "-9", str(_attempt(fast, "pl-a", 1)["trainer_pid"]))
        wait_for(fast, "pl-a", lambda s: s["state"] != "running")
        vm1 = _vm_id(fast, "gpukit-1")
        res = kit.glue("recover", "--run", "pl-a", check=False)
        line = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert "gpukit-1 also runs live run pl-c" in line and "no other VM is free" in line, res.stderr
        assert NoCapacity.said_in(line)  # `glue watch` waits for a VM instead of counting a failed recovery
        assert "gpukit-2 (run pl-b)" in line and "glue up --vms 3" in line, line
        res = kit.glue("recover", "--run", "pl-a", "--same-vm", check=False)
        assert res.returncode == 1 and "--same-vm: gpukit-1 also runs live run pl-c" in res.stderr, res.stderr
        assert _vm_id(fast, "gpukit-1") == vm1 and fast.glue("ssh", "gpukit-1", "--", "true").returncode == 0

        # gpukit-2 freed: pl-a moves there, its resume verified; gpukit-1 is not replaced and pl-c runs on.
        kit.glue("stop", "--run", "pl-b")
        assert status(fast, "pl-c")["state"] == "running"
        res = kit.glue("recover", "--run", "pl-a", timeout=600)
        out = " ".join((res.stdout + res.stderr).split())
        assert "gpukit-1 also runs live run pl-c, so it is not replaced; run pl-a moves to gpukit-2" in out, out
        assert "resume verified" in out, out
        rec = json.loads(fast.glue("status", "--run", "pl-a", "--json").stdout)
        assert rec["attempt"] == 2 and rec["vm"] == "gpukit-2", rec
        assert _vm_id(fast, "gpukit-1") == vm1
        # The neighbour: never stopped, never recovered; its first and only attempt trains on after the recovery.
        before = status(fast, "pl-c")
        assert before["state"] == "running" and before["attempt"] == 1, explain(fast, "pl-c", before)
        after = wait_for(fast, "pl-c", lambda s: (s["step"] or 0) > (before["step"] or 0), timeout=120)
        assert after["state"] == "running" and after["attempt"] == 1, explain(fast, "pl-c", after)
    finally:
        for run in ("pl-a", "pl-b", "pl-c"):
            fast.glue("stop", "--run", run, check=False)

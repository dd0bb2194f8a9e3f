"""A 2-VM torchrun group (gloo, 1 process per VM): a worker dies and torchrun restarts the group, which
resumes from the checkpoint; then a VM is lost, the incident names the lost VM as the cause and the
survivor's error as its consequence, and `glue recover` re-forms the group on a new VM. Every rank's
per-step losses equal those of an uninterrupted 2-node reference run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.integration.test_runs import here, run_config, s3, status

from .conftest import Kit

pytestmark = pytest.mark.e2e
CONFIG = {"steps": 60, "checkpoint_interval": 10}


def get_json(client: Any, key: str) -> Any:
    return bucket_store.read_json(client, "gpukit", key)  # re-reads a record caught mid-replace


def wait_beat(client: Any, run: str, pred: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    beat: dict[str, Any] = {}
    while time.monotonic() < deadline:
        beat = get_json(client, layout.run_prefix(run) + layout.heartbeat_key(0)) or {}
        if pred(beat):
            return beat
        time.sleep(0.5)
    raise AssertionError(f"run {run}: heartbeat never matched; last {beat}")


def losses(kit: Kit, run: str, rank: int) -> dict[int, float]:
    """step -> loss of one rank, later attempts and restarts replacing earlier ones."""

    out: dict[int, float] = {}
    for _, steps in sorted(RunStore.open(kit.home, run).metrics(rank).items()):
        out.update({step: rec["loss"] for step, rec in steps.items()})
    return out


def vm_id(kit: Kit, name: str) -> str:
    return next(v["id"] for v in json.loads(kit.glue("status", "--json").stdout)["vms"] if v["name"] == name)


@pytest.mark.timeout(600)
def test_two_node_group_restarts_and_recovers_to_the_reference_losses(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)  # fast: in-process glue for the polls and look-ups
    client = s3(fast)
    # Same training config; the pause per step (which does not change any loss) keeps the reference ahead.
    ref_cfg = run_config(tmp_path, "ref.yaml", config={**CONFIG, "step_sleep": 0.05}, checkpoint={"interval_steps": 10})
    # The group's run ships a workdir: every node prepares the same package, by its hash, from the bucket.
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "NOTES.md").write_text("the 2-node group's own files\n")
    cfg = run_config(tmp_path, config={**CONFIG, "step_sleep": 0.3}, checkpoint={"interval_steps": 10},
                     workdir=str(tmp_path / "work"))
    for bad, says in ((["--nodes", "3"], "needs 3 VMs but the cluster has 2; run `glue up --vms 3`"),
                      (["--nodes", "2", "--vm", "gpukit-2"], "names its 2 distinct VMs, comma-separated"),
                      (["--nodes", "0"], "0 is not in the range x>=1")):
        res = kit.glue("deploy", "--run", "mn-bad", "--config", str(cfg), *bad, check=False)
        assert res.returncode != 0 and says in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert get_json(client, layout.run_prefix("mn-bad") + layout.MANIFEST) is None  # nothing recorded
    # The reference shares both VMs with the group on purpose (--vm): it runs beside it, for the same losses.
    kit.glue("deploy", "--run", "mn-ref", "--config", str(ref_cfg), "--nodes", "2", "--vm", "gpukit-1,gpukit-2")
    out = kit.glue("deploy", "--run", "mn", "--config", str(cfg), "--nodes", "2", "--max-restarts", "1",
                   "--vm", "gpukit-1,gpukit-2")
    assert "rendezvous 127.0.0.1:" in out.stderr
    record = get_json(client, layout.run_prefix("mn") + layout.attempt_key(1))
    assert [n["vm"] for n in record["nodes"]] == ["gpukit-1", "gpukit-2"]
    code = get_json(client, layout.run_prefix("mn") + layout.MANIFEST)["workdir"]["sha256"]
    assert [n["code_sha256"] for n in record["nodes"]] == [code, code]

    # A worker dies: torchrun restarts both nodes' workers, and every rank resumes from the checkpoint.
    wait_beat(client, "mn", lambda b: (b.get("step") or 0) >= 12)
    fast.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "python -u -m glue.examples.tiny_gpt")
    wait_beat(client, "mn", lambda b: b.get("restart", 0) >= 1 and (b.get("step") or 0) >= 22)
    # (The reference must be done before its VM goes too.)
    wait_beat(client, "mn-ref", lambda b: b.get("step") == CONFIG["steps"])
    deadline = time.monotonic() + 60
    while get_json(client, layout.run_prefix("mn-ref") + layout.exit_key(1, 1)) is None:
        assert time.monotonic() < deadline, "the reference run did not finish"
        time.sleep(0.5)

    # The VM of node 1 is lost: the group stops; the lost VM is the cause, the survivor's error follows.
    LocalBackend(kit.home).delete_vm(vm_id(fast, "gpukit-2"))
    deadline = time.monotonic() + 90
    while (st := status(fast, "mn"))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(1)
    assert st["state"] == "vm_lost", st
    assert st["nodes"] == ["gpukit-1", "gpukit-2"] and st["rendezvous"].startswith("127.0.0.1:")
    [incident] = json.loads(kit.glue("incidents", "--run", "mn", "--json").stdout)
    assert incident["cause"]["kind"] == "vm_lost" and incident["cause"]["vm"] == "gpukit-2"
    after = [e for e in incident["consequences"] if e["vm"] == "gpukit-1"]
    assert after and after[0]["kind"] == "error" and after[0]["at"] >= incident["cause"]["at"], incident
    text = kit.glue("incidents", "--run", "mn").stdout
    assert "cause:" in text and "gpukit-2" in text and "then:" in text
    stopped_at = wait_beat(client, "mn", lambda b: True)["step"]
    time.sleep(2)
    assert wait_beat(client, "mn", lambda b: True)["step"] == stopped_at  # nobody trains on

    # Recovery replaces the lost VM, re-forms the group and verifies every rank's resume.
    rec_out = kit.glue("recover", "--run", "mn", timeout=400)
    assert "resume verified" in rec_out.stderr, rec_out.stderr
    rec = get_json(client, layout.run_prefix("mn") + layout.recovery_key(1))
    assert rec["verified"] and rec["world_size"] == 2 and rec["old_vm"]["name"] == "gpukit-2"
    assert [n["replaced"] for n in rec["nodes"]] == [False, True]
    assert set(rec["seconds"]) == {"detect", "validate", "provision", "configure", "verify", "prepare", "restore",
                                   "replay"}
    second = get_json(client, layout.run_prefix("mn") + layout.attempt_key(2))
    assert [n["code_sha256"] for n in second["nodes"]] == [code, code]

    for run in ("mn-ref", "mn"):
        deadline = time.monotonic() + 180
        while status(fast, run)["state"] != "completed":
            assert time.monotonic() < deadline, status(fast, run)
            time.sleep(1)
    for rank in (0, 1):
        ref, got = losses(kit, "mn-ref", rank), losses(kit, "mn", rank)
        assert sorted(ref) == list(range(1, CONFIG["steps"] + 1)) == sorted(got)
        assert got == ref, f"rank {rank}: first differing step {min(s for s in ref if ref[s] != got[s])}"
    # The two ranks trained on different shards: equal losses are not one rank copied twice.
    assert losses(kit, "mn", 0) != losses(kit, "mn", 1)


@pytest.mark.timeout(300)
def test_one_vm_two_processes_train_as_one_group(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 8, "step_sleep": 0, "checkpoint_interval": 4},
                     checkpoint={"interval_steps": 4})
    out = kit.glue("deploy", "--run", "pp", "--config", str(cfg), "--procs-per-node", "2", "--vm", "gpukit-1")
    assert "1 nodes (gpukit-1) x 2 processes" in " ".join(out.stderr.split())
    deadline = time.monotonic() + 180
    while (st := status(fast, "pp"))["state"] == "running":
        assert time.monotonic() < deadline, st
        time.sleep(1)
    assert st["state"] == "completed", st
    per_rank = [losses(kit, "pp", rank) for rank in (0, 1)]
    assert [sorted(p) for p in per_rank] == [list(range(1, 9))] * 2 and per_rank[0] != per_rank[1]


@pytest.mark.timeout(600)
def test_a_sharded_two_node_run_loses_a_vm_and_continues_on_one(cluster_kit: Kit, tmp_path: Path) -> None:
    """FSDP2 over 2 VMs; node 1's VM is lost and not replaced: `glue recover --nodes 1` continues the run on
    the survivor from the sharded checkpoint (resharded 2 -> 1), checks the data position exactly and the
    losses within the relative tolerance, and the status and the report say that this check was applied."""
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    cfg = run_config(tmp_path, config={"steps": 40, "checkpoint_interval": 10, "parallel": "fsdp", "step_sleep": 0.3},
                     checkpoint={"interval_steps": 10})
    kit.glue("deploy", "--run", "shard", "--config", str(cfg), "--nodes", "2", "--vm", "gpukit-1,gpukit-2")
    wait_beat(client, "shard", lambda b: (b.get("step") or 0) >= 13)
    commit = get_json(client, layout.run_prefix("shard") + layout.commit_key(10))
    assert commit["sharded"] == ["model", "optimizer"] and commit["world_size"] == 2
    LocalBackend(kit.home).delete_vm(vm_id(fast, "gpukit-2"))
    deadline = time.monotonic() + 90
    while (st := status(fast, "shard"))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(1)
    assert st["state"] == "vm_lost", st
    try:
        bad = kit.glue("recover", "--run", "shard", "--nodes", "3", check=False)
        assert bad.returncode != 0 and "a recovery continues it on as many or fewer" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr
        assert get_json(client, layout.run_prefix("shard") + layout.recovery_key(1)) is None

        out = kit.glue("recover", "--run", "shard", "--nodes", "1", timeout=400, check=False)
        assert out.returncode == 0, out.stderr + kit.glue("logs", "--run", "shard", "--attempt", "2").stdout[-3000:]
        said = " ".join(out.stderr.split())
        assert "resume check: resharded (world size 2 -> 1)" in said and "resume verified" in said, out.stderr
        rec = get_json(client, layout.run_prefix("shard") + layout.recovery_key(1))
        assert rec["verified"] and rec["world_size"] == 1 and rec["dropped_vms"] == ["gpukit-2"], rec
        assert rec["resume_check"]["kind"] == "resharded" and rec["first_resumed_step"] == rec["checkpoint_step"] + 1
        assert "configure" not in rec["seconds"]  # nothing provisioned, nothing configured
        manifest = get_json(client, layout.run_prefix("shard") + layout.MANIFEST)
        assert manifest["distributed"] is None and manifest["group_changes"][0]["attempt"] == 2
        second = get_json(client, layout.run_prefix("shard") + layout.attempt_key(2))
        assert [n["vm"] for n in second["nodes"]] == ["gpukit-1"]
        deadline = time.monotonic() + 180
        while (st := status(fast, "shard"))["state"] != "completed":
            assert time.monotonic() < deadline, st
            time.sleep(1)
        assert sorted(losses(kit, "shard", 0)) == list(range(1, 41))
        assert "check resharded, world size 2 -> 1" in st["last_recovery"]
        kit.glue("report", "--run", "shard", "--out", str(tmp_path / "r.html"))
        assert "check resharded, world size 2 -&gt; 1" in (tmp_path / "r.html").read_text()
    finally:
        kit.glue("up", "--vms", "2", timeout=600)  # the shared cluster gets its second VM back


# `stress` (make test-all): make test has the survivor's resharded resume (the test above) and a watcher's
# wait for capacity that spends no budget (tests/unit/test_watch_policy.py); this joins them.
@pytest.mark.stress
@pytest.mark.timeout(600)
def test_watch_continues_a_group_on_its_survivor_when_no_vm_is_free(cluster_kit: Kit, tmp_path: Path) -> None:
    """recovery.min_nodes: node 1's VM is lost and the backend has no capacity for another
    (GPUKIT_LOCAL_CAPACITY=1, as a cloud with no free GPU): `glue watch`'s recovery cannot replace it, so the
    run continues on gpukit-1 from its sharded checkpoint, resharded and checked as such."""
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    cfg = run_config(tmp_path, config={"steps": 30, "checkpoint_interval": 10, "parallel": "fsdp", "step_sleep": 0.3},
                     checkpoint={"interval_steps": 10}, recovery={"min_nodes": 1})
    kit.glue("deploy", "--run", "wshard", "--config", str(cfg), "--nodes", "2", "--vm", "gpukit-1,gpukit-2")
    wait_beat(client, "wshard", lambda b: (b.get("step") or 0) >= 13)
    LocalBackend(kit.home).delete_vm(vm_id(fast, "gpukit-2"))
    deadline = time.monotonic() + 90
    while (st := status(fast, "wshard"))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(1)
    assert st["state"] == "vm_lost", st
    try:
        out = kit.glue("watch", "--run", "wshard", "--once", env={**kit.env, "GPUKIT_LOCAL_CAPACITY": "1"},
                       timeout=500, check=False)
        said = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == 0, said
        assert "no capacity" in said and "continuing on the 1 surviving of 2 VMs (recovery.min_nodes 1)" in said, said
        rec = get_json(client, layout.run_prefix("wshard") + layout.recovery_key(1))
        assert rec["verified"] and rec["resume_check"]["kind"] == "resharded" and rec["world_size"] == 1, rec
        deadline = time.monotonic() + 180
        while (st := status(fast, "wshard"))["state"] != "completed":
            assert time.monotonic() < deadline, st
            time.sleep(1)
        assert sorted(losses(kit, "wshard", 0)) == list(range(1, 31))
    finally:
        kit.glue("up", "--vms", "2", timeout=600)

"""Runs through Slurm on a local cluster of 3 VMs x 1 GPU and a warm spare (`glue up --scheduler slurm --spares 1`;
the GPUs are the slurm role's stand-in device files): the nodes idle with their GPU, the spare held out, a test
job ran on each node, the munge key secret; five one-GPU runs queue (three run, two wait for Resources) and all
five complete with their outputs; each start's CUDA_VISIBLE_DEVICES is its allocation's GPU; a two-node run
trains through srun + torchrun and `glue stop` cancels it; a run asking 2 GPUs per node is refused in one line
with nothing submitted or written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cluster import current
from glue.infra import ssh
from glue.runs.store import RunStore
from glue.scheduler.slurm import SPARE_REASON, queue
from glue.scheduler.slurm import nodes as slurm_nodes
from glue.train import layout
from tests.integration.test_runs import here, run_config, s3
from tests.integration.test_slurm_cluster import verified_with_the_key_secret
from tests.kit import GLUE, remove_kit_home_machines

from .conftest import Kit

pytestmark = pytest.mark.e2e
RUNS = [f"q{k}" for k in range(1, 6)]


def slurm_cluster(factory: pytest.TempPathFactory, name: str, vms: int, spares: int = 0) -> Iterator[Kit]:
    """A Slurm cluster of its own (slurmctld on gpukit-1, slurmd on every VM, one stand-in GPU each), gone after."""
    home = factory.mktemp(name) / "home"
    home.mkdir()
    kit = Kit(home=home, env={**os.environ, "GPUKIT_HOME": str(home)})
    try:  # a failed up too leaves no machine running
        kit.glue("up", "--vms", str(vms), "--spares", str(spares), "--scheduler", "slurm", timeout=900)
        yield kit
    finally:
        kit.glue("down", "--force", check=False, timeout=300)
        remove_kit_home_machines(home)


@pytest.fixture(scope="module")
def slurm_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """One Slurm cluster of three VMs and a warm spare for the module."""
    yield from slurm_cluster(tmp_path_factory, "slurm", 3, spares=1)


def on_head(kit: Kit, command: str) -> str:
    """`command`'s output on the head, over glue's own SSH in this process (polled: no `glue` process each time)."""
    res = ssh.run(kit.home, current.host(kit.home, "gpukit-1"), command, timeout=120)
    assert res.exit_code == 0, f"{command}: exit {res.exit_code}: {res.stderr}"
    return res.stdout


def squeue(kit: Kit) -> dict[str, dict[str, str]]:
    """run -> {job, state, reason} of glue's jobs."""
    out = on_head(kit, "squeue -h -a -o '%i|%j|%T|%r'")
    jobs = {}
    for line in out.splitlines():
        job, name, state, reason = line.split("|")
        if name.startswith("gpukit-"):
            jobs[name[len("gpukit-"):]] = {"job": job, "state": state, "reason": reason}
    return jobs


def slurm_view(kit: Kit) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(here(kit).glue("status", "--json").stdout)["slurm"]
    return view


def wait(what: str, pred: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


NODES = ("gpukit-1", "gpukit-2", "gpukit-3")


def test_the_cluster_is_up_with_every_node_idle_the_spare_drained_and_the_munge_key_secret(slurm_kit: Kit) -> None:
    """First in the module, on the cluster as `glue up` left it. (tests/integration/test_slurm_cluster.py, in
    make test-all, adds a node converged again after its slurmd died and `--scheduler none`.)"""
    home = slurm_kit.home
    assert json.loads((home / "cluster.json").read_text())["scheduler"] == "slurm"
    assert slurm_nodes.head(home).name == "gpukit-1"
    # Every node of the partition idle with its (stand-in) GPU; the spare a node too, drained.
    states = {n.name: n for n in slurm_nodes.node_states(home)}
    assert sorted(states) == [*NODES, "gpukit-spare-1"], states
    for name in NODES:
        assert (states[name].state, states[name].gres) == ("idle", "gpu:1"), states[name]
    assert (states["gpukit-spare-1"].state, states["gpukit-spare-1"].reason) == ("drained", SPARE_REASON)
    assert slurm_nodes.gpus_total_and_used(home) == (3, 0)
    # A test job ran on each node, a job gets its GPU, the munge key is secret.
    verified_with_the_key_secret(home, NODES, ("gpukit-spare-1",), [])


def test_a_run_asking_more_gpus_per_node_than_any_node_has_is_refused(slurm_kit: Kit, tmp_path: Path) -> None:
    kit = slurm_kit
    cfg = run_config(tmp_path, resources={"gpus_per_node": 2})
    res = kit.glue("deploy", "--run", "too-big", "--config", str(cfg), check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "resources.gpus_per_node is 2, but no node of the Slurm cluster has more than 1" \
        in line[0], res.stderr
    assert "too-big" not in squeue(kit)  # nothing submitted
    assert not s3(here(kit)).list_objects_v2(Bucket="gpukit", Prefix=layout.run_prefix("too-big")).get("Contents")


def allocated_gpu(kit: Kit, job: str) -> str:
    """The GPU index Slurm allocated to a running job (scontrol's GRES=gpu:1(IDX:0))."""
    found = re.search(r"IDX:([0-9,-]+)\)", on_head(kit, f"scontrol show job -d {job}"))
    assert found, f"job {job} has no GPU index in scontrol show job -d"
    return found.group(1)


@pytest.mark.timeout(900)
def test_five_one_gpu_runs_queue_on_three_gpus_and_all_complete(slurm_kit: Kit, tmp_path: Path) -> None:
    kit, fast = slurm_kit, here(slurm_kit)
    # Three long runs (80 steps of a second: they still train while the last two are deployed, ~25 s of preflight
    # each here) fill the three GPUs; two short ones (10 steps) then queue behind them and run once GPUs free.
    def config(steps: int) -> Path:
        return run_config(tmp_path, f"run-{steps}.yaml", config={"steps": steps, "step_sleep": 1.0},
                          checkpoint={"interval_steps": 20}, resources={"gpus_per_node": 1, "time": "00:30:00"})

    def deploy(runs: list[str], cfg: Path) -> None:
        procs = [subprocess.Popen([*GLUE, "deploy", "--run", run, "--config", str(cfg)], env=kit.env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                 for run in runs]
        for proc in procs:
            _, said = proc.communicate(timeout=300)
            assert proc.returncode == 0 and "submitted to Slurm as job" in said, said

    def running() -> int:
        return sum(j["state"] == "RUNNING" for j in squeue(kit).values())

    deploy(RUNS[:3], config(80))
    wait("three jobs running", lambda: running() == 3, 120)
    deploy(RUNS[3:], config(10))

    def queued() -> dict[str, dict[str, str]] | None:  # once Slurm's scheduler gave the two their reasons
        q = squeue(kit)
        return q if all(q[r]["state"] == "PENDING" and q[r]["reason"] != "None" for r in RUNS[3:]) else None

    jobs = wait("the last two jobs queued", queued, 60)
    assert {r for r in RUNS if jobs[r]["state"] == "RUNNING"} == set(RUNS[:3]), jobs
    pending = [jobs[r] for r in RUNS[3:]]
    # The first job in line waits for GPUs (Resources); one behind it may wait its turn (Priority).
    assert "Resources" in {j["reason"] for j in pending} and {j["reason"] for j in pending} <= {"Resources",
                                                                                                  "Priority"}, jobs
    view = slurm_view(kit)
    assert view["gpus"] == {"total": 3, "used": 3, "free": 0}, view
    shown = {r["run"]: r for r in view["runs"]}
    assert {shown[r]["job_id"] for r in RUNS} == {jobs[r]["job"] for r in RUNS}
    assert {r for r in RUNS if shown[r]["state"] == "PENDING" and shown[r]["reason"]} == \
        {r for r in RUNS if jobs[r]["state"] == "PENDING"}
    # Each running start was given the GPU Slurm allocated to its job.
    for run in (r for r in RUNS if jobs[r]["state"] == "RUNNING"):
        store = RunStore.open(kit.home, run)
        rec = wait(f"{run}'s attempt record", lambda s=store: s.attempt(1) or None, 60)
        assert rec["scheduler"]["job_id"] == jobs[run]["job"] and rec["vm"] == rec["scheduler"]["nodelist"]
        assert rec["scheduler"]["cuda_visible_devices"] == allocated_gpu(kit, jobs[run]["job"]), rec

    def all_done() -> bool:
        return all(RunStore.open(kit.home, r).exit_record(1, 0) is not None for r in RUNS)

    wait("all five runs ended", all_done, 600)
    for run in RUNS:
        st = json.loads(fast.glue("status", "--run", run, "--json").stdout)
        assert st["state"] == "completed", st
        store = RunStore.open(kit.home, run)
        assert store.exit_record(1, 0)["exit_code"] == 0  # type: ignore[index]
        out = f"{layout.run_prefix(run)}{layout.OUTPUTS}/"
        keys = [o["Key"] for o in s3(fast).list_objects_v2(Bucket="gpukit", Prefix=out).get("Contents", [])]
        assert {out + "model.pt", out + "final.json"} <= set(keys), keys
    assert not {r for r in RUNS if r in squeue(kit) and squeue(kit)[r]["state"] in ("RUNNING", "PENDING")}
    assert "gpukit: job" in fast.glue("logs", "--run", RUNS[0], "--job-output").stdout


@pytest.mark.timeout(420)
def test_a_two_node_run_trains_through_srun_and_torchrun_and_glue_stop_cancels_it(slurm_kit: Kit,
                                                                                   tmp_path: Path) -> None:
    """`resources: {nodes: 2}`: one srun task per node, each its node's torchrun agent at the allocation's
    rendezvous (the port picked on node 0), both ranks training one DDP group on two nodes; node 0 records the
    attempt with both nodes; `glue stop` cancels the job, every node's processes with it."""
    kit, fast = slurm_kit, here(slurm_kit)
    store = RunStore.open(kit.home, "stopme")
    cfg = run_config(tmp_path, config={"steps": 2000, "step_sleep": 0.2},
                     resources={"nodes": 2, "gpus_per_node": 1, "time": "00:30:00"})
    kit.glue("deploy", "--run", "stopme", "--config", str(cfg))

    def both_ranks_step() -> list[dict[str, Any]] | None:
        beats = store.heartbeats(1)
        return beats if len(beats) == 2 and all(b.get("step") for b in beats) else None

    beats = wait("both ranks of stopme train", both_ranks_step, 240)
    # (torchrun's c10d rendezvous numbers the ranks in its own order: rank 0 may be on either node)
    assert sorted((b["rank"], b["world_size"]) for b in beats) == [(0, 2), (1, 2)], beats
    job = squeue(kit)["stopme"]
    record = store.attempt(1)
    on = {b["node"]: b["vm"] for b in beats}
    assert [n["vm"] for n in record["nodes"]] == [on[0], on[1]] and on[0] != on[1], (record, beats)
    assert record["scheduler"]["job_id"] == job["job"] and record["vm"] == on[0], record
    # A cancel names the run's job by id and name: an id that is by now another run's job (a new head numbers
    # jobs from 1 again) is left alone.
    queue.cancel(kit.home, job["job"], "another-run")
    time.sleep(2)
    assert squeue(kit)["stopme"]["state"] == "RUNNING", squeue(kit)
    out = kit.glue("stop", "--run", "stopme")
    assert "cancelled (scancel)" in out.stderr, out.stderr
    wait("stopme's job gone from the queue", lambda: "stopme" not in squeue(kit) or
         squeue(kit)["stopme"]["state"] not in ("RUNNING", "PENDING", "REQUEUED"), 60)
    assert store.attempt(1)["failure_class"] == "killed"
    assert json.loads(fast.glue("status", "--run", "stopme", "--json").stdout)["state"] == "killed"
    # No trainer (nor torchrun agent) left on either node: Slurm's SIGTERM, then its SIGKILL after KillWait.
    for vm in sorted(on.values()):
        left = ""
        for _ in range(60):
            left = kit.glue("ssh", vm, "--", "sh", "-c", "pgrep -af 'glue[.]examples[.]tiny_gpt' || true").stdout
            left = left.strip()
            if not left:
                break
            time.sleep(1)
        assert not left, f"{vm} still runs: {left}"


@pytest.mark.timeout(300)
def test_slurmctld_down_is_one_line_for_deploy_and_status(slurm_kit: Kit, tmp_path: Path) -> None:
    kit = slurm_kit
    on_head(kit, "systemctl stop slurmctld")
    try:
        res = kit.glue("deploy", "--run", "ctld-down", "--config", str(run_config(tmp_path)), check=False)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "slurmctld on gpukit-1 does not answer" in lines[0], res.stderr
        assert not s3(here(kit)).list_objects_v2(Bucket="gpukit", Prefix=layout.run_prefix("ctld-down")).get("Contents")
        st = kit.glue("status")
        assert "Slurm: slurmctld on gpukit-1 does not answer" in " ".join(st.stderr.split()), st.stderr
        assert "does not answer" in json.loads(kit.glue("status", "--json").stdout)["slurm"]["error"]
    finally:
        on_head(kit, "systemctl start slurmctld")


def vm_id(kit: Kit, name: str) -> str:
    return str(next(v["id"] for v in json.loads(kit.glue("status", "--json").stdout)["vms"] if v["name"] == name))


def lose_past_a_checkpoint(kit: Kit, store: RunStore, doomed: str, timeout: float) -> None:
    """Destroy VM `doomed` as soon as the steps in the bucket (shipped metrics, the heartbeat's recent ones) are a
    few past a checkpoint after step 30 (20 surely committed; checkpoints every 10 steps): the restart's resumed
    losses then have steps to be compared with, however slow this host is (deleted just after a checkpoint, none
    had reached the bucket: none compared)."""
    wait("steps in the bucket a few past a checkpoint", lambda: 31 <= (seen := max(
        store.metrics(0).get(1, {}) or [0])) <= 80 and 1 <= seen % 10 <= 6, timeout)
    LocalBackend(kit.home).delete_vm(doomed)


@pytest.mark.timeout(900)
def test_a_lost_nodes_job_is_requeued_and_its_resume_verified(slurm_kit: Kit, tmp_path: Path) -> None:
    """Last in the module: gpukit-2 stays lost. The job is placed on gpukit-2 (the other nodes drained while
    it is), gpukit-3 takes part again, gpukit-2's VM is destroyed under the running trainer: Slurm marks it
    down and requeues the job, which starts again on gpukit-3 from the newest valid checkpoint; glue checks
    that resume as it checks a recovery (first step = checkpoint + 1, equal losses) and records it."""
    kit, fast = slurm_kit, here(slurm_kit)
    store = RunStore.open(kit.home, "lost")
    cfg = run_config(tmp_path, config={"steps": 90, "step_sleep": 0.2}, checkpoint={"interval_steps": 10})
    on_head(kit, "scontrol update nodename=gpukit-1,gpukit-3 state=drain reason=e2e-placement")
    try:
        kit.glue("deploy", "--run", "lost", "--config", str(cfg))
        first = wait("attempt 1 on gpukit-2", lambda: store.attempt(1) or None, 180)
        assert first["vm"] == "gpukit-2", first
    finally:
        # (resuming a node already in service is an error to scontrol: each alone, whatever it says)
        on_head(kit, "for n in gpukit-1 gpukit-3; do scontrol update nodename=$n state=resume; done; true")
    doomed = vm_id(fast, "gpukit-2")
    lose_past_a_checkpoint(kit, store, doomed, 180)
    # SlurmdTimeout marks the node down; a requeued batch job waits out Slurm's credential lifetime (120 s).
    second = wait("the requeued start", lambda: store.attempt(2) or None, 400)
    sched = second["scheduler"]
    assert second["vm"] != "gpukit-2" and sched["job_id"] == first["scheduler"]["job_id"], second
    assert sched["restart_count"] == 1 and sched["resume_from"] >= 20, second
    # `glue recover` of a Slurm run starts no attempt beside Slurm's restart: it replaces the lost node's VM
    # (back in the partition under its name) and says where the job stands; recovery flags are refused.
    bad = kit.glue("recover", "--run", "lost", "--same-vm", check=False)
    assert bad.returncode != 0 and "runs under Slurm" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    out = kit.glue("recover", "--run", "lost", timeout=900)
    said = " ".join(out.stderr.split())
    assert "gpukit-2 lost; replacing" in said and f"Slurm job {sched['job_id']}" in said, out.stderr
    states = {n.name: n for n in slurm_nodes.node_states(kit.home)}
    assert states["gpukit-2"].in_service, states["gpukit-2"]
    assert store.attempts() == [1, 2]  # glue started nothing: the attempts are Slurm's start and restart
    wait("the requeued run ends", lambda: store.exit_record(2, 0), 300)
    st = json.loads(fast.glue("status", "--run", "lost", "--json").stdout)
    assert st["state"] == "completed", st
    rec = store.recoveries()[-1]
    assert (rec["failed_attempt"], rec["new_attempt"], rec["failure_class"]) == (1, 2, "vm_lost"), rec
    assert rec["verified"] and rec["first_resumed_step"] == sched["resume_from"] + 1, rec
    assert rec["compared_steps"] and rec["checkpoint_step"] == sched["resume_from"], rec
    assert "verified" in st["last_recovery"], st
    # The watcher leaves a Slurm run to Slurm: one pass reads it completed, nothing recovered by glue.
    watched = kit.glue("watch", "--once", "--run", "lost", timeout=300)
    assert "lost: completed" in watched.stderr and "Slurm job" in watched.stderr, watched.stderr
    assert store.attempts() == [1, 2]


# `stress` (make test-all, ~4 min: Slurm's node timeout and credential lifetime): make test loses a single-node
# job's node (above) and has a two-node job train and stop; the classes and world size a multi-node restart is
# judged by are tests/unit/test_slurm_requeue_class.py's.
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_a_two_node_jobs_lost_node_requeues_the_whole_job_and_every_rank_resumes_exactly(slurm_kit: Kit,
                                                                                          tmp_path: Path) -> None:
    """After the single-node loss (gpukit-2 replaced by then): a two-node job placed on gpukit-2 and gpukit-3
    (gpukit-1 drained while it is) loses gpukit-3's VM under its running ranks. Slurm requeues the whole job; it
    starts again on the two nodes left, both ranks from the newest valid checkpoint, and glue checks every rank's
    resume and records it as the recovery of a lost VM at world size 2."""
    kit, fast = slurm_kit, here(slurm_kit)
    store = RunStore.open(kit.home, "lost2")
    cfg = run_config(tmp_path, config={"steps": 90, "step_sleep": 0.2}, checkpoint={"interval_steps": 10},
                     resources={"nodes": 2, "gpus_per_node": 1, "time": "00:30:00"})
    on_head(kit, "scontrol update nodename=gpukit-1 state=drain reason=e2e-placement")
    try:
        kit.glue("deploy", "--run", "lost2", "--config", str(cfg))
        first = wait("attempt 1 on gpukit-2 and gpukit-3", lambda: store.attempt(1) or None, 240)
    finally:
        on_head(kit, "scontrol update nodename=gpukit-1 state=resume; true")
    assert sorted(n["vm"] for n in first["nodes"]) == ["gpukit-2", "gpukit-3"], first
    lose_past_a_checkpoint(kit, store, vm_id(fast, "gpukit-3"), 240)
    second = wait("the requeued start", lambda: store.attempt(2) or None, 400)
    sched = second["scheduler"]
    assert sched["job_id"] == first["scheduler"]["job_id"] and sched["restart_count"] == 1, second
    assert sorted(n["vm"] for n in second["nodes"]) == ["gpukit-1", "gpukit-2"], second
    wait("the requeued run ends", lambda: store.exit_record(2, 0), 400)
    st = json.loads(fast.glue("status", "--run", "lost2", "--json").stdout)
    assert st["state"] == "completed", st
    rec = store.recoveries()[-1]
    assert (rec["failed_attempt"], rec["new_attempt"], rec["failure_class"]) == (1, 2, "vm_lost"), rec
    assert rec["world_size"] == 2 and rec["verified"] and rec["compared_steps"], rec
    assert rec["first_resumed_step"] == sched["resume_from"] + 1 == rec["checkpoint_step"] + 1, rec
    assert store.attempt(1)["failure_class"] == "vm_lost" and "node" in store.attempt(1)["reason"], store.attempt(1)

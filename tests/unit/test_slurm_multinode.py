"""A multi-node Slurm job (resources.nodes > 1): refused only when the cluster has too few nodes for it; the
batch script (run for real under bash, srun a stand-in) picks node 0's rendezvous port, starts one task per node
and notices every node; each node's start runs its torchrun agent at the allocation's rendezvous, and node 0's
attempt record names every node."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.scheduler.slurm import SPARE_REASON
from glue.scheduler.slurm.batch import BatchScript, SbatchOptions
from glue.scheduler.slurm.nodes import NodeState
from glue.scheduler.slurm.submit import check_fits
from glue.train import layout
from glue.train import trainer_vars as V
from glue.train.run.launch import SpecBucket, TrainerEnv
from glue.train.run.slurm_group import RDZV_PORT, JobGroup, free_port
from glue.train.run.slurm_job import Allocation, SlurmJobSpec, attempt_record, launch_spec, notice_file
from glue.train.run.torchrun import GroupShape


def test_a_job_asking_more_nodes_than_the_cluster_has_outside_its_spares_is_refused() -> None:
    nodes = [NodeState("gpukit-1", "idle", "gpu:1", ""), NodeState("gpukit-2", "down*", "gpu:1", "Not responding"),
             NodeState("gpukit-spare-1", "drained", "gpu:1", SPARE_REASON)]
    check_fits(SbatchOptions("r1", nodes=2), nodes)  # a node down now comes back (or is replaced)
    with pytest.raises(GlueError, match=r"resources.nodes is 3, but the Slurm cluster has 2 node\(s\) with 1 GPU\(s\) "
                                        r"outside the spares \(gpukit-1, gpukit-2\): ask for at most 2"):
        check_fits(SbatchOptions("r1", nodes=3), nodes)


def _spec() -> SlurmJobSpec:
    target = layout.run_uri("b", "r1")
    env = TrainerEnv(run="r1", checkpoint=target, outputs=f"{target}/{layout.OUTPUTS}", bucket_name="b")
    return SlurmJobSpec(run="r1", first_attempt=1, resume=False,
                        command=["/opt/gpukit/venv/bin/python", "-m", "glue.examples.tiny_gpt"], env=env.to_env(),
                        bucket=SpecBucket(name="b"), credentials_file="/run/gpukit/c.json", credentials="{}",
                        image_python="/opt/gpukit/venv/bin/python", scratch="/tmp", backend="local",
                        vm_ids={"gpukit-1": "id-1", "gpukit-2": "id-2"}, nodes=2, procs_per_node=1)


def test_each_node_runs_its_torchrun_agent_at_the_allocations_rendezvous() -> None:
    spec = SlurmJobSpec.from_json(_spec().to_json())
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    # Names as the slurm role makes them resolve (here: localhost for both nodes).
    group = JobGroup(shape=GroupShape(nodes=2), nodes=("localhost", "localhost"), index=1, port=29555)
    alloc = Allocation(job_id="9", restart_count=0, nodelist="gpukit-[1-2]", node="gpukit-2", gpus="0", node_index=1,
                       rdzv_port=29555)
    launch = launch_spec(spec, alloc, 1, None, notice_file("r1", "9"), group)
    assert launch.node == 1 and launch.env[V.NODE] == "1" and launch.env[V.VM] == "gpukit-2"
    # not the head: no store of its own, but its agent too runs under process_group
    assert launch.command[:4] == ["/opt/gpukit/venv/bin/python", "-m", "glue.train.run.process_group", "--"]
    assert {"--nnodes=2", "--nproc-per-node=1", "--rdzv-endpoint=127.0.0.1:29555", "--rdzv-id=r1-1",
            "--local-addr=127.0.0.1"} <= set(launch.command) and launch.command[-2:] == ["-m", "glue.examples.tiny_gpt"]
    assert launch.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    head = launch_spec(spec, Allocation("9", 0, "gpukit-[1-2]", "gpukit-1", "0", 0, 29555), 1, None,
                       notice_file("r1", "9"), JobGroup(GroupShape(nodes=2), ("localhost", "localhost"), 0, 29555))
    assert head.command[2:4] == ["glue.train.run.process_group", "--host-store=127.0.0.1:29555"]
    record = attempt_record(spec, alloc, 1, group)
    assert [(n["node"], n["vm"]) for n in record["nodes"]] == [(0, "localhost"), (1, "localhost")]
    named = attempt_record(spec, alloc, 1, JobGroup(GroupShape(nodes=2), ("gpukit-1", "gpukit-2"), 1, 29555))
    assert named["vm"] == "gpukit-1" and [n["vm_id"] for n in named["nodes"]] == ["id-1", "id-2"]
    # The environment srun gives each task.
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpukit-[1-2]", "SLURMD_NODENAME": "gpukit-2",
           "SLURM_NODEID": "1", RDZV_PORT: "29555", "CUDA_VISIBLE_DEVICES": "0"}
    assert Allocation.from_env(env) == alloc
    assert 0 < free_port("localhost") < 65536


def _bin(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


# srun's stand-in: the notice step (--overlap) runs its command once; the job's step runs it once per node, each
# with its SLURM_NODEID, and exits with the highest status (as srun does).
SRUN = """echo "$@" >> "$LOG"
if [ "$1" = --overlap ]; then shift 5; "$@"; exit $?; fi
shift 2
for n in 0 1; do SLURM_NODEID=$n "$@" & done
code=0; for j in $(jobs -p); do wait "$j" || code=$?; done; exit $code
"""
# python's stand-in: the rendezvous port; a node's start waits for its notice and says so with its node and port.
PYTHON = """if [ "$2" = glue.train.run.slurm_group ]; then echo 29555; exit 0; fi
while [ ! -e "$3" ]; do sleep 0.05; done; echo "node $SLURM_NODEID saved (port $GPUKIT_SLURM_RDZV_PORT)"; exit 75
"""


def test_the_batch_script_starts_a_task_per_node_and_every_node_gets_the_notice(tmp_path: Path) -> None:
    run = f"unit-slurm-mn-{os.getpid()}"
    folder = Path(notice_file(run, "0")).parent
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _bin(bin_dir, "srun", SRUN)
    _bin(bin_dir, "python", PYTHON)
    _bin(bin_dir, "scontrol", f'echo "$@" > {tmp_path}/scontrol.args\n')
    script = tmp_path / "job.sh"
    script.write_text(BatchScript(run, SbatchOptions(run=run, nodes=2), str(bin_dir / "python")).render())
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "91", "SLURM_RESTART_COUNT": "0",
           "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "gpukit-1", "LOG": str(tmp_path / "srun.log")}
    try:
        proc = subprocess.Popen(["bash", str(script)], env=env)
        out = Path(f"{folder}/slurm-91.out")
        deadline = time.monotonic() + 30
        while "srun.log" not in os.listdir(tmp_path):
            assert time.monotonic() < deadline, "the batch script never ran srun"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=30) == 0  # both saved (PREEMPTED_EXIT): the job requeued itself
        text = out.read_text()
        assert "node 0 saved (port 29555)" in text and "node 1 saved (port 29555)" in text, text
        steps = (tmp_path / "srun.log").read_text().splitlines()
        assert steps[0].startswith("--kill-on-bad-exit=1 --ntasks-per-node=1 ") and "slurm_job" in steps[0], steps
        assert steps[1].startswith("--overlap --gres=none --ntasks-per-node=1 -N 2 touch "), steps
        assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "91"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)

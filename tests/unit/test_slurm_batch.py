"""A run as a Slurm batch job: run.yaml's `resources:` into sbatch's options, the batch script (its USR1
notice and requeue run for real under bash), the job's start on its node (attempt number, resume, notice
file, the allocation recorded), and the refusals made before anything is submitted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from glue.errors import GlueError
from glue.runs import config
from glue.runs.config_resources import slurm_time_seconds
from glue.runs.vm_group import GroupSpec
from glue.scheduler.slurm.batch import BatchScript, SbatchOptions, gpus_of, run_of_job
from glue.scheduler.slurm.nodes import NodeState
from glue.scheduler.slurm.queue import gpus_held, parse_job_id, parse_squeue
from glue.scheduler.slurm.submit import check_fits, refuse_flags
from glue.train import layout
from glue.train import trainer_vars as V
from glue.train.run.launch import SpecBucket, TrainerEnv
from glue.train.run.slurm_job import Allocation, SlurmJobSpec, attempt_record, launch_spec, notice_file

BASE: dict[str, Any] = {"command": ["python", "-m", "glue.examples.tiny_gpt"],
                        "outputs": {"destination": "s3://b/runs/{run}/outputs"},
                        "checkpoint": {"target": "s3://b/runs/{run}"}}


def _resources(**r: Any) -> config.ResourcesSpec | None:
    return config.parse({**BASE, "resources": r}, "r1", "b").resources


def test_resources_become_sbatch_options() -> None:
    opts = SbatchOptions.of("r1", _resources(gpus_per_node=2, nodes=1, cpus_per_gpu=4, mem_per_gpu="8G",
                                             time="1-00:00:00", notice_seconds=120))
    assert opts.args() == ["--job-name=gpukit-r1", "--partition=gpu", "--nodes=1", "--gres=gpu:2",
                           "--ntasks-per-node=1", "--cpus-per-gpu=4", "--mem-per-gpu=8G", "--time=1-00:00:00",
                           "--requeue", "--signal=B:USR1@120", "--output=/tmp/gpukit-slurm-%j.out", "--export=ALL"]
    # Without `resources:` a run asks one GPU on one node, and leaves the rest to the partition's defaults.
    plain = SbatchOptions.of("r2", None).args()
    assert "--gres=gpu:1" in plain and "--nodes=1" in plain and "--requeue" in plain
    assert not any(a.startswith(("--time", "--mem-per-gpu", "--cpus-per-gpu")) for a in plain)
    assert run_of_job("gpukit-r1") == "r1" and run_of_job("someone-else") is None


@pytest.mark.parametrize(("resources", "needle"), [
    ({"gpus_per_node": 0}, "resources.gpus_per_node"),
    ({"nodes": "2"}, "resources.nodes"),
    ({"mem_per_gpu": "8 GB"}, "resources.mem_per_gpu"),
    ({"time": "an hour"}, "resources.time"),
    ({"time": "1", "notice_seconds": 60}, "notice_seconds (60) must be below the time limit (1)"),
    ({"gpus": 1}, "unknown key 'gpus' in resources"),
])
def test_bad_resources_are_one_line_naming_the_key(resources: dict[str, Any], needle: str) -> None:
    with pytest.raises(GlueError) as err:
        config.parse({**BASE, "resources": resources}, "r1", "b")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_time_limits_in_every_slurm_form() -> None:
    assert [slurm_time_seconds(t) for t in ("30", "5:30", "1:00:00", "2-0", "1-2:03", "1-0:0:10")] == \
        [1800, 330, 3600, 172800, 93780, 86410]


def test_a_run_asking_more_gpus_per_node_than_any_node_has_is_refused() -> None:
    nodes = [NodeState("gpukit-1", "idle", "gpu:1", ""), NodeState("gpukit-2", "mixed", "gpu:1(S:0)", "")]
    check_fits(SbatchOptions("r1", gpus_per_node=1), nodes)
    with pytest.raises(GlueError, match=r"gpus_per_node is 2, but no node of the Slurm cluster has more than 1 "
                                        r"GPU\(s\) \(gpukit-1 1, gpukit-2 1\): ask for at most 1"):
        check_fits(SbatchOptions("r1", gpus_per_node=2), nodes)
    assert [gpus_of(g) for g in ("gpu:1", "gpu:a100:4", "gpu:2(S:0-1)", "")] == [1, 4, 2, 0]


def test_what_slurm_decides_is_refused_as_a_flag() -> None:
    for kwargs, needle in (({"resume": True}, "--resume"), ({"vm": "gpukit-2"}, "--vm"),
                           ({"group": GroupSpec(nodes=2)}, "resources: {nodes: N")):
        with pytest.raises(GlueError, match=needle):
            refuse_flags(**{"resume": False, "vm": None, "group": GroupSpec(), **kwargs})


def test_squeue_lines_and_sbatch_ids() -> None:
    text = ("12|gpukit-a|RUNNING|None|gpukit-1|gres/gpu:1|1\n13|gpukit-b|PENDING|Resources|(null)|gres/gpu:1|1\n"
            "14|gpukit-c|PENDING|Priority||gres/gpu:1|1\n15|theirs|RUNNING|None|gpukit-2|N/A|1\n")
    jobs = parse_squeue(text)
    assert [(j.job_id, j.run, j.state, j.reason, j.nodes) for j in jobs] == [
        ("12", "a", "RUNNING", "", "gpukit-1"), ("13", "b", "PENDING", "Resources", ""),
        ("14", "c", "PENDING", "Priority", "")]
    assert [gpus_held(j) for j in jobs] == [1, 0, 0]  # only a running job holds its GPUs
    assert parse_job_id("42\n") == "42" and parse_job_id("43;cluster") == "43"
    with pytest.raises(GlueError, match="sbatch did not print a job id"):
        parse_job_id("sbatch: error: Batch job submission failed")


def _spec(**kw: Any) -> SlurmJobSpec:
    target = layout.run_uri("b", "r1")
    env = TrainerEnv(run="r1", checkpoint=target, outputs=f"{target}/{layout.OUTPUTS}", bucket_name="b")
    return SlurmJobSpec(**{"run": "r1", "first_attempt": 1, "resume": False,
                           "command": ["/opt/gpukit/venv/bin/python", "-m", "glue.examples.tiny_gpt"],
                           "env": {**env.to_env(), "WANDB_API_KEY": "s3cret"}, "bucket": SpecBucket(name="b"),
                           "credentials_file": "/run/gpukit/c.json", "credentials": "{}",
                           "image_python": "/opt/gpukit/venv/bin/python", "scratch": "/var/lib/gpukit/scratch",
                           "backend": "local", "vm_ids": {"gpukit-2": "id-2"}, **kw})


def test_each_start_of_the_job_is_the_next_attempt_and_resumes() -> None:
    spec = SlurmJobSpec.from_json(_spec().to_json())
    assert spec == _spec()
    first = Allocation(job_id="7", restart_count=0, nodelist="gpukit-2", node="gpukit-2", gpus="0")
    launch = launch_spec(spec, first, 1, None, notice_file("r1", "7"))
    assert launch.attempt == 1 and launch.env[V.RESUME] == "0" and launch.env[V.ATTEMPT] == "1"
    assert launch.env[V.NOTICE_FILE] == "/run/gpukit/runs/r1/slurm-7.notice" and launch.env[V.VM] == "gpukit-2"
    assert launch.env["WANDB_API_KEY"] == "s3cret"  # in the 0600 launch spec, as on any VM
    again = Allocation(job_id="7", restart_count=2, nodelist="gpukit-3", node="gpukit-3", gpus="0")
    launch = launch_spec(spec, again, 3, {"python": "/venv/bin/python", "code_dir": "/code",
                                          "package_sha256": "ab"}, notice_file("r1", "7"))
    assert launch.env[V.RESUME] == "1" and launch.env[V.ATTEMPT] == "3" and launch.cwd == "/code"
    assert launch.command[0] == "/venv/bin/python" and launch.env["PYTHONPATH"] == "/code"
    record = attempt_record(spec, first, 1)
    assert record["vm"] == "gpukit-2" and record["vm_id"] == "id-2" and record["resume"] is False
    assert record["scheduler"] == {"name": "slurm", "job_id": "7", "restart_count": 0, "nodelist": "gpukit-2",
                                   "cuda_visible_devices": "0"}
    assert attempt_record(spec, again, 3)["resume"] is True


def _bin(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_the_batch_script_turns_usr1_into_the_notice_and_requeues_on_the_save(tmp_path: Path) -> None:
    """The rendered script under bash: Slurm's USR1 (to the batch shell only) writes the job's notice file;
    a trainer that saved and exited PREEMPTED_EXIT has the job requeued (scontrol), a failure is not."""
    run = f"unit-slurm-{os.getpid()}"
    folder = Path(notice_file(run, "0")).parent
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The trainer's stand-in: waits for the notice file (named as slurm_job is told), then exits as it would.
    _bin(bin_dir, "python", 'while [ ! -e "$3" ]; do sleep 0.05; done; echo "saved on $3"; exit "${EXIT:-75}"\n')
    _bin(bin_dir, "scontrol", f'echo "$@" > {tmp_path}/scontrol.args\n')
    script = tmp_path / "job.sh"
    script.write_text(BatchScript(run, SbatchOptions.of(run, None), str(bin_dir / "python")).render())
    try:
        for job, exit_code, requeued, job_rc in (("77", 75, True, 0), ("78", 1, False, 1)):
            (tmp_path / "scontrol.args").unlink(missing_ok=True)
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": "0",
                   "EXIT": str(exit_code)}
            proc = subprocess.Popen(["bash", str(script)], env=env)
            out = Path(f"{folder}/slurm-{job}.out")
            deadline = time.monotonic() + 30
            while f"gpukit: job {job} start" not in (out.read_text() if out.exists() else ""):
                assert time.monotonic() < deadline, "the batch script never started"
                time.sleep(0.05)
            proc.send_signal(signal.SIGUSR1)
            assert proc.wait(timeout=30) == job_rc
            text = out.read_text()
            assert "termination notice" in text and f"saved on {folder}/slurm-{job}.notice" in text
            assert ((tmp_path / "scontrol.args").read_text().split() == ["requeue", job]) if requeued \
                else not (tmp_path / "scontrol.args").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

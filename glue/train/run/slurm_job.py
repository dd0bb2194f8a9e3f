"""A Slurm batch job's start on its node: `python -m glue.train.run.slurm_job NOTICE_FILE`, run by the batch
script glue.scheduler.slurm.batch renders.

Every (re)start of the job is an attempt of the run: attempt = the job's first attempt + SLURM_RESTART_COUNT
(a requeued job resumes from the newest valid checkpoint). Here, on the allocated node: the bucket keys
written 0600, the attempt recorded (job id, node list, the GPUs Slurm allocated), the run's code and
requirements prepared as on any VM, then the same supervisor as a VM attempt runs the trainer (heartbeat,
metrics, checkpoints, exit record). The job's spec (command, environment with secrets, bucket keys) comes in
the job's environment (GPUKIT_SLURM_SPEC, kept by slurmctld like any job environment), never in arguments.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glue.train import trainer_vars as V
from glue.train.layout import attempt_key, run_uri
from glue.train.run.launch import LaunchSpec, SpecBucket, TrainerEnv, node_vars, workdir_vars
from glue.train.run.slurm_group import RDZV_PORT, GroupError, JobGroup
from glue.train.run.torchrun import node_env, torchrun_argv
from glue.train.state_paths import RUN_STATE_ROOT, StatePaths
from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.target import Storage, open_target
from glue.train.utc import iso, utc_now


def notice_file(run: str, job_id: str) -> str:
    """Where the batch script writes the termination notice (Slurm's USR1 before the time limit or on
    preemption) for this job's trainer only; removed at every (re)start of the job."""
    return f"{RUN_STATE_ROOT}/{run}/slurm-{job_id}.notice"


def output_file(run: str, job_id: str) -> str:
    """The batch script's own output on its node, every (re)start appended."""
    return f"{RUN_STATE_ROOT}/{run}/slurm-{job_id}.out"


@dataclass(frozen=True)
class SlurmJobSpec:
    """What every start of the job needs: written once by `glue deploy`."""

    run: str
    first_attempt: int
    resume: bool
    command: list[str]
    env: dict[str, str]  # run.yaml's env, the secrets, the first attempt's TrainerEnv
    bucket: SpecBucket
    credentials_file: str
    credentials: str  # the bucket keys file's content, written 0600 on the node
    image_python: str  # the runtime's python the command names (the run's venv python once prepared)
    scratch: str
    backend: str
    vm_ids: dict[str, str] = field(default_factory=dict)  # node (VM) name -> VM id, as the cluster had them
    workspace: dict[str, Any] | None = None  # glue.workdir.pin.Workspace.prepare_spec less the attempt
    memory_limit_mb: int | None = None
    nodes: int = 1  # resources.nodes: more than one runs the command under torchrun on every node (srun)
    procs_per_node: int = 1  # torchrun's processes per node: resources.gpus_per_node

    def to_json(self) -> str:
        doc = dataclasses.asdict(self)
        doc["bucket"] = self.bucket.as_dict()
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> SlurmJobSpec:
        doc = json.loads(text)
        doc["bucket"] = SpecBucket(**doc["bucket"])
        return cls(**doc)


@dataclass(frozen=True)
class Allocation:
    """This start of the job as Slurm describes it in the batch script's environment."""

    job_id: str
    restart_count: int
    nodelist: str
    node: str
    gpus: str | None  # CUDA_VISIBLE_DEVICES as Slurm set it from the job's GPUs (gres)
    node_index: int = 0  # SLURM_NODEID: this task's node in a multi-node job (srun)
    rdzv_port: int | None = None  # a multi-node job's rendezvous port, picked on node 0 by the batch script

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Allocation:
        port = env.get(RDZV_PORT, "")
        return cls(job_id=env.get("SLURM_JOB_ID", ""), restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
                   nodelist=env.get("SLURM_JOB_NODELIST", ""),
                   node=env.get("SLURMD_NODENAME") or socket.gethostname(), gpus=env.get("CUDA_VISIBLE_DEVICES"),
                   node_index=int(env.get("SLURM_NODEID") or 0), rdzv_port=int(port) if port.isdigit() else None)

    def as_record(self) -> dict[str, Any]:
        return {"name": "slurm", "job_id": self.job_id, "restart_count": self.restart_count,
                "nodelist": self.nodelist, "cuda_visible_devices": self.gpus}


def attempt_record(spec: SlurmJobSpec, alloc: Allocation, number: int,
                   group: JobGroup | None = None) -> dict[str, Any]:
    """attempts/<n>.json as glue.runs.records.AttemptRecord (its `nodes` as AttemptNode) spells it, with the
    Slurm start it was (written by node 0, which names every node of a multi-node job)."""
    names = group.nodes if group else (alloc.node,)
    nodes = [{"node": k, "vm": name, "vm_id": spec.vm_ids.get(name)} for k, name in enumerate(names)]
    return {"run": spec.run, "attempt": number, "vm": names[0], "vm_id": spec.vm_ids.get(names[0]),
            "backend": spec.backend, "resume": spec.resume or number > spec.first_attempt, "nodes": nodes,
            "started_at": iso(utc_now()),
            "memory_limit_mb": spec.memory_limit_mb, "scheduler": alloc.as_record()}


def _write_private(path: str, data: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(data)


def _records(spec: SlurmJobSpec) -> Storage:
    return open_target(run_uri(spec.bucket.name, spec.run), endpoint_url=spec.bucket.endpoint,
                       region=spec.bucket.region, credentials=lambda: credentials_from_file(spec.credentials_file),
                       check=False)


def launch_spec(spec: SlurmJobSpec, alloc: Allocation, number: int, ready: dict[str, Any] | None,
                notice: str, group: JobGroup | None = None) -> LaunchSpec:
    """The supervisor's launch spec for this start: the attempt's number and resume flag, the node, the
    prepared code and venv, the job's own notice file; in a multi-node job the command under torchrun."""
    base = TrainerEnv.from_env(spec.env)
    trainer = dataclasses.replace(base, attempt=number, resume=spec.resume or number > spec.first_attempt)
    env = {**spec.env, **trainer.to_env(), **node_vars(alloc.node_index, alloc.node), V.NOTICE_FILE: notice}
    argv, cwd = list(spec.command), None
    if ready:
        if argv and argv[0] == spec.image_python:
            argv[0] = str(ready["python"])
        code = ready.get("code_dir")
        if code:
            extra = env.get("PYTHONPATH")
            env.update(workdir_vars(code, str(ready["package_sha256"])))
            env["PYTHONPATH"] = f"{code}:{extra}" if extra else code
            cwd = code
    if group is not None:
        rdzv = group.rendezvous()
        argv = torchrun_argv(str(ready["python"]) if ready else spec.image_python, argv, group.shape, rdzv,
                             group.index, spec.run, number)
        env = {**node_env(rdzv, group.index), **env}  # a user's own setting in run.yaml `env` wins
    return LaunchSpec(run=spec.run, attempt=number, node=alloc.node_index, command=argv, env=env, bucket=spec.bucket,
                      memory_limit_mb=spec.memory_limit_mb, credentials_file=spec.credentials_file,
                      cwd=cwd or spec.scratch)


def prepare_workspace(spec_path: str) -> dict[str, Any]:
    """The run's code and venv for this attempt, by the same `python -m glue.train.workspace prepare` a VM
    attempt runs. Raises RuntimeError with its one-line reason."""
    res = subprocess.run([sys.executable, "-m", "glue.train.workspace", "prepare", spec_path], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"glue.train.workspace prepare exited {res.returncode}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def newest_valid_checkpoint(spec: SlurmJobSpec) -> int | None:
    """The checkpoint this start resumes from (the trainer takes the newest valid one), read before it starts:
    recorded so the resume check knows it even once keep_last has pruned it."""
    from glue.train.checkpoint.format import newest_valid

    target = TrainerEnv.from_env(spec.env).checkpoint
    storage = open_target(target, endpoint_url=spec.bucket.endpoint, region=spec.bucket.region,
                          credentials=lambda: credentials_from_file(spec.credentials_file), check=False)
    found = newest_valid(storage, deep=False)
    return found.step if found is not None else None


def _supervise(spec_path: str, pids_path: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The same supervisor a VM attempt runs, started; returns it with its pids once it started the trainer.

    Slurm's SIGTERM (scancel, the time limit) reaches every process of the step at once. This one passes it on
    and stays until the supervisor has ended: were it to die first, the supervisor and the trainer below it
    would leave the step's process tree (proctrack/linuxproc follows parents), and Slurm's SIGKILL after
    KillWait would miss them."""
    proc = subprocess.Popen([sys.executable, "-m", "glue.train.run.supervise", spec_path])

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    pids = Path(pids_path)
    while proc.poll() is None:
        try:
            return proc, dict(json.loads(pids.read_text()))
        except (OSError, ValueError):
            time.sleep(0.1)  # not written yet (or half written)
    return proc, {}


def _group(spec: SlurmJobSpec, alloc: Allocation) -> JobGroup | None:
    """A multi-node job's group as this node sees it; None for a single-node job."""
    if spec.nodes <= 1:
        return None
    return JobGroup.of(alloc.nodelist, alloc.node_index, alloc.rdzv_port, spec.procs_per_node)


def start(spec: SlurmJobSpec, alloc: Allocation, notice: str) -> int:
    """This start of the job on this node: prepares the workspace, starts the supervisor; node 0 records the
    attempt once its trainer runs (a record without a trainer reads as one that never started). Its exit code."""
    number = spec.first_attempt + alloc.restart_count
    paths = StatePaths.of(spec.run, number)
    _write_private(spec.credentials_file, spec.credentials)
    try:
        group = _group(spec, alloc)
    except GroupError as exc:
        print(f"gpukit: {alloc.node} cannot join the job's group: {exc}", file=sys.stderr)
        return 2
    record = attempt_record(spec, alloc, number, group)
    records = _records(spec)
    recorder = alloc.node_index == 0
    ready = None
    if spec.workspace:
        ws = {**spec.workspace, "attempt": number, "bucket": spec.bucket.as_dict(),
              "credentials_file": spec.credentials_file}
        _write_private(paths.workspace_spec, json.dumps(ws))
        try:
            ready = prepare_workspace(paths.workspace_spec)
        except RuntimeError as exc:
            print(f"gpukit: preparing the run's workspace failed on {alloc.node}: {exc}", file=sys.stderr)
            if recorder:  # (another node's failure ends the job: srun --kill-on-bad-exit)
                record.update(failure_class="user_error", reason=f"preparing the run's workspace failed: {exc}",
                              ended_at=iso(utc_now()))
                records.put(attempt_key(number), json.dumps(record).encode())
            return 2
        record["nodes"][0].update(code_sha256=ready["package_sha256"], requirements_set=ready["requirements_set"])
    if recorder and (alloc.restart_count or spec.resume):  # a requeue, or a resubmission after the head was lost
        record["scheduler"]["resume_from"] = newest_valid_checkpoint(spec)
    Path(notice).parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # where the batch script's USR1 trap touches
    _write_private(paths.spec, launch_spec(spec, alloc, number, ready, notice, group).to_json().decode())
    Path(spec.scratch).mkdir(parents=True, exist_ok=True)
    proc, pids = _supervise(paths.spec, paths.pids)
    if recorder:
        record["nodes"][0].update(pids)
        record.update(pids)
        records.put(attempt_key(number), json.dumps(record).encode())
    return proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m glue.train.run.slurm_job NOTICE_FILE (inside a Slurm batch job)", file=sys.stderr)
        return 2
    text = os.environ.pop(V.SLURM_SPEC, "")  # the trainer does not inherit the bucket keys
    if not text:
        print(f"gpukit: {V.SLURM_SPEC} is not set: this runs inside a batch job `glue deploy` submitted",
              file=sys.stderr)
        return 2
    return start(SlurmJobSpec.from_json(text), Allocation.from_env(dict(os.environ)), argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

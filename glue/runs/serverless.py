"""`runtime: lyceum-run`: every attempt of a run is one Lyceum serverless execution, no VM of ours.

The attempt's launch spec (command, GPUKIT_* environment; never a secret) goes into the bucket
(attempts/<n>.launch.json); the execution runs `python3 -m glue.train.run.execution <run> <n>` in the
user's image (gpukit's trainer library inside), which reads it from the bucket at /mnt/s3 and runs the
supervisor there: the same exit record, shipped log, heartbeat, metrics and checkpoints as on a VM,
written through the mount (GPUKIT_BUCKET_VIA=mount). Secrets reach the container by name through the
execution's environment only.

An execution may run for `execution.timeout` units at most. The trainer is told the moment to save and
stop before that cap (GPUKIT_STOP_AT, a termination notice): its attempt ends `capped`, and `glue
watch` (or `glue recover`) starts the next execution from that checkpoint, from no budget.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud.lyceum.executions import Executions, Submission
from glue.cluster import current
from glue.errors import GlueError
from glue.runs import config as runconfig
from glue.runs import lease, trainer_env
from glue.runs.records import AttemptNode, AttemptRecord, Manifest
from glue.runs.serverless_state import executions
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store
from glue.train.run.launch import LaunchSpec, SpecBucket
from glue.train.storage.mount import MOUNT

RUNTIME = "lyceum-run"
ENTRY = ["python3", "-m", "glue.train.run.execution"]
SCRATCH = "/tmp/gpukit/scratch"


def use_lyceum_bucket(home: Path) -> None:
    """A serverless run keeps its records in Lyceum's bucket: the kit's backend must be Lyceum. A kit with no
    VMs is switched (as `glue up --backend lyceum` would); one with VMs elsewhere is refused."""
    cfg = current.ClusterConfig.load(home)
    if cfg.backend == "lyceum":
        return
    if current.hosts(home):
        raise GlueError(f"runtime {RUNTIME} keeps the run in Lyceum's bucket, but this kit's cluster runs on the "
                        f"{cfg.backend} backend: `glue down` first, or use another GPUKIT_HOME")
    cfg.backend = "lyceum"
    cfg.save(home)


def check(store: RunStore, rc: runconfig.RunConfig) -> None:
    """Before anything is written: every durable location is in the bucket (the container's disk is gone
    after the execution), and the submission is well-formed with every secret set."""
    for what, location in rc.locations().items():
        if bucket_store.as_s3_prefix(location, store.info.name) is None:
            raise GlueError(f"{what} {location} is not in the bucket: an execution's own disk is gone when it ends; "
                            f"use s3://{store.info.name}/... or a path under {MOUNT}")
    _submission(store, rc, 1).body()  # problems and missing secrets in one line, nothing sent


def _submission(store: RunStore, rc: runconfig.RunConfig, attempt: int) -> Submission:
    ex = rc.execution or runconfig.ExecutionSpec()
    return Submission(image=str(rc.image), command=[*ENTRY, store.run, str(attempt)], secrets=tuple(rc.secrets),
                      execution_type=ex.type, timeout=ex.timeout)


def launch_spec(store: RunStore, rc: runconfig.RunConfig, attempt: int, resume: bool, stop_at: float) -> LaunchSpec:
    """What the execution's supervisor runs, as on a VM; the bucket through the platform's mount."""
    tenv = trainer_env.for_execution(store, rc, attempt, resume, SCRATCH, f"{RUNTIME}-{attempt}", stop_at)
    return LaunchSpec(run=store.run, attempt=attempt, command=list(rc.command),
                      env={**rc.env, **tenv.to_env(), "PYTHONUNBUFFERED": "1"},
                      bucket=SpecBucket(name=store.info.name, via="mount", mount=MOUNT))


def start_execution(store: RunStore, rc: runconfig.RunConfig, attempt: int, resume: bool,
                  runs: Executions | None = None) -> AttemptRecord:
    """Record attempt n, put its launch spec in the bucket, start its execution. The save-before-cap moment
    counts from now (the execution's own start is later, so the trainer stops early rather than late)."""
    ex = rc.execution or runconfig.ExecutionSpec()
    stop_at = time.time() + ex.cap_seconds - ex.save_margin_seconds
    sub = _submission(store, rc, attempt)
    store.put_launch(attempt, json.loads(launch_spec(store, rc, attempt, resume, stop_at).to_json()))
    execution = {"id": None, "type": ex.type, "timeout": ex.timeout, "cap_seconds": ex.cap_seconds,
                 "stop_at": stop_at, "image": rc.image}
    record = AttemptRecord(run=store.run, attempt=attempt, vm=f"{RUNTIME}-{attempt}", vm_id=None, backend="lyceum",
                           resume=resume, nodes=[], execution=execution)
    store.put_attempt(record)  # recorded before it starts: a start whose answer is lost is still findable
    started = (runs or executions()).start(sub)
    execution["id"] = record.vm_id = started.id
    record.nodes = [AttemptNode(node=0, vm=record.vm, vm_id=started.id)]
    store.put_attempt(record)
    return record


def deploy(home: Path, store: RunStore, rc: runconfig.RunConfig, resume: bool, console: Console,
           eval_pin: dict[str, Any] | None = None) -> dict[str, Any]:
    """`glue deploy` of a lyceum-run config: preflight, record the manifest, submit attempt 1 (or the next).
    eval_pin: the evaluation set as checked at deploy (glue.runs.deploy.check_eval_set)."""
    exists = store.exists()
    if exists and not resume:
        raise GlueError(f"run {store.run!r} already exists in the bucket; pick a new run id, or add --resume")
    if resume and not exists:
        raise GlueError(f"cannot resume run {store.run!r}: it does not exist in the bucket; deploy it without --resume")
    check(store, rc)
    with lease.held(store, "deploy", new_run=not exists):
        attempts = store.attempts()
        attempt = (max(attempts) + 1) if attempts else 1
        if not exists:
            ex = rc.execution or runconfig.ExecutionSpec()
            # The execution type's GPU (gpu.a100 -> a100) prices it: the VM price of that GPU, on-demand.
            environment = {"backend": "lyceum", "runtime": RUNTIME, "execution_type": ex.type,
                           "gpu_type": ex.type.removeprefix("gpu."), "gpu_count": 1, "market": "on-demand"}
            store.put_manifest(Manifest.of_run(store, rc, environment, eval_pin))
        record = start_execution(store, rc, attempt, resume=resume or attempt > 1)
    console.print(f"[green]run {store.run}[/] attempt {attempt} submitted as Lyceum execution "
                  f"{record.execution_id} ({(record.execution or {}).get('type')}); follow it with "
                  f"`glue logs --run {store.run} -f`")
    return record.to_dict()

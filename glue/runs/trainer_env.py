"""The trainer's environment for one attempt (glue.train.run.launch.TrainerEnv), built here once for both
places a trainer runs: a VM of the cluster (the bucket through the S3 API, keys in a 0600 file) and a
serverless execution (the bucket only through its platform's mount, no keys)."""

from __future__ import annotations

import dataclasses

from glue.runs import config as runconfig
from glue.runs import remote
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store
from glue.train.run.launch import TrainerEnv
from glue.train.storage.mount import mount_path


def _common(store: RunStore, rc: runconfig.RunConfig, attempt: int, resume: bool, scratch: str) -> TrainerEnv:
    return TrainerEnv(run=store.run, attempt=attempt, resume=resume, config=rc.config,
                      checkpoint=rc.checkpoint.target, checkpoint_interval=rc.checkpoint.interval_steps,
                      keep_last=rc.checkpoint.keep_last, outputs=rc.outputs.destination,
                      heartbeat_seconds=rc.monitor.heartbeat_seconds, scratch=scratch, bucket_name=store.info.name)


def for_vm(store: RunStore, rc: runconfig.RunConfig, attempt: int, resume: bool) -> TrainerEnv:
    """On a VM: the bucket through the S3 API; the evaluation set read that way and checked by its pin."""
    env = _common(store, rc, attempt, resume, remote.SCRATCH)
    env = dataclasses.replace(env, bucket_endpoint=store.info.endpoint, bucket_region=store.info.signing_region,
                              credentials_file=remote.CREDENTIALS_PATH)
    ds = rc.evaluation.dataset if rc.evaluation else None
    if ds is None:
        return env
    key = bucket_store.as_s3_prefix(ds.uri, store.info.name)
    return dataclasses.replace(env, eval_uri=f"s3://{store.info.name}/{key}", eval_sha256=ds.sha256)


def for_execution(store: RunStore, rc: runconfig.RunConfig, attempt: int, resume: bool, scratch: str, vm: str,
                  stop_at: float) -> TrainerEnv:
    """In a serverless execution: the bucket only at the platform's mount; told when to save and stop."""
    env = dataclasses.replace(_common(store, rc, attempt, resume, scratch), via_mount=True, vm=vm, stop_at=stop_at)
    ds = rc.evaluation.dataset if rc.evaluation else None
    if ds is None:
        return env
    return dataclasses.replace(env, eval_uri=mount_path(ds.uri, store.info.name), eval_sha256=ds.sha256)

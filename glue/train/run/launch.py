"""What crosses from the controller to the VM when an attempt starts, as types built once.

TrainerEnv   the GPUKIT_* variables the trainer reads (RunContext): `to_env()` on the controller,
             `from_env()` on the VM, with the defaults in one place.
LaunchSpec   what the supervisor runs: attempt-<n>.json on the VM's tmpfs (glue.train.state_paths), or
             attempts/<n>.launch.json in the bucket for a serverless attempt (no secret there).

Their wire forms (variable names, JSON keys) are spelled here only. Light on purpose (no torch): the
supervisor and the controller import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from glue.train import trainer_vars as V
from glue.train.storage.mount import MOUNT

# Field -> variable; every one optional on the wire except the four a trainer cannot run without.
_ENV_NAMES = {
    "run": V.RUN, "attempt": V.ATTEMPT, "resume": V.RESUME, "config": V.CONFIG, "checkpoint": V.CHECKPOINT,
    "checkpoint_interval": V.CHECKPOINT_INTERVAL, "keep_last": V.KEEP_LAST, "outputs": V.OUTPUTS,
    "heartbeat_seconds": V.HEARTBEAT_SECONDS, "scratch": V.SCRATCH, "bucket_name": V.BUCKET_NAME,
    "bucket_endpoint": V.BUCKET_ENDPOINT, "bucket_region": V.BUCKET_REGION, "credentials_file": V.CREDENTIALS_FILE,
    "via_mount": V.BUCKET_VIA, "bucket_mount": V.BUCKET_MOUNT, "vm": V.VM, "node": V.NODE, "stop_at": V.STOP_AT,
    "eval_uri": V.EVAL_URI, "eval_sha256": V.EVAL_SHA256, "hold_at": V.HOLD_AT, "workdir": V.WORKDIR,
    "code_sha256": V.CODE_SHA256,
}
REQUIRED = ("run", "checkpoint", "outputs", "bucket_name")


@dataclass(frozen=True)
class TrainerEnv:
    """The run as the trainer sees it. None: not set (the trainer's default applies)."""

    run: str
    checkpoint: str
    outputs: str
    bucket_name: str
    attempt: int = 1
    resume: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    checkpoint_interval: int = 50
    keep_last: int = 2
    heartbeat_seconds: float = 2.0
    scratch: str = "/tmp"
    bucket_endpoint: str | None = None
    bucket_region: str | None = None
    credentials_file: str | None = None
    via_mount: bool = False  # a serverless run: the bucket only through its platform's mount
    bucket_mount: str | None = None  # where that mount is (MOUNT when not set)
    vm: str | None = None
    node: int | None = None
    stop_at: float | None = None  # epoch seconds to save and stop by (a serverless execution's cap)
    eval_uri: str | None = None
    eval_sha256: str | None = None
    hold_at: str | None = None  # `glue drill`: "<attempt>:<step>", the step the attempt holds after
    workdir: str | None = None  # the run's code package on this node (set per node once it is prepared)
    code_sha256: str | None = None

    @property
    def mount(self) -> str:
        return self.bucket_mount or MOUNT

    def to_env(self) -> dict[str, str]:
        """The variables, unset ones left out."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "via_mount" and not value):
                continue
            if f.name == "config":
                text = json.dumps(value)
            elif f.name == "resume":
                text = "1" if value else "0"
            elif f.name == "via_mount":
                text = "mount"
            elif f.name == "stop_at":
                text = f"{value:.3f}"
            else:
                text = str(value)
            out[_ENV_NAMES[f.name]] = text
        return out

    @classmethod
    def from_env(cls, env: dict[str, str]) -> TrainerEnv:
        """Raises MissingTrainerEnv naming the first required variable that is missing."""
        for name in REQUIRED:
            if _ENV_NAMES[name] not in env:
                raise MissingTrainerEnv(_ENV_NAMES[name])

        def get(name: str) -> str | None:
            return env.get(_ENV_NAMES[name]) or None

        stop_at = (get("stop_at") or "").strip()
        try:
            deadline = float(stop_at) if stop_at else None
        except ValueError:
            raise ValueError(f"{V.STOP_AT}={stop_at!r} is not epoch seconds") from None
        return cls(
            run=env[V.RUN], checkpoint=env[V.CHECKPOINT], outputs=env[V.OUTPUTS], bucket_name=env[V.BUCKET_NAME],
            attempt=int(get("attempt") or 1), resume=get("resume") == "1",
            config=json.loads(get("config") or "{}"), checkpoint_interval=int(get("checkpoint_interval") or 50),
            keep_last=int(get("keep_last") or 2), heartbeat_seconds=float(get("heartbeat_seconds") or 2),
            scratch=get("scratch") or "/tmp", bucket_endpoint=get("bucket_endpoint"),
            bucket_region=get("bucket_region"), credentials_file=get("credentials_file"),
            via_mount=get("via_mount") == "mount", bucket_mount=get("bucket_mount"), vm=get("vm"),
            node=int(get("node") or 0), stop_at=deadline, eval_uri=get("eval_uri"),
            eval_sha256=get("eval_sha256"), hold_at=get("hold_at"), workdir=get("workdir"),
            code_sha256=get("code_sha256"),
        )


class MissingTrainerEnv(LookupError):
    """The trainer runs outside a deployment: `glue deploy` (or a test giving the same environment) sets it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not set: this trainer runs under `glue deploy`, which sets gpukit's "
                         "environment; to try the loop without a cluster give it that environment "
                         "(docs/guides/trainer-contract.md)")
        self.name = name


def node_vars(node: int, vm: str) -> dict[str, str]:
    """Which node of the attempt this is, on which VM: set per node over the attempt's TrainerEnv."""
    return {V.NODE: str(node), V.VM: vm}


def workdir_vars(code_dir: str, sha256: str) -> dict[str, str]:
    """Where the run's verified code package is on this node: set per node once it is prepared."""
    return {V.WORKDIR: code_dir, V.CODE_SHA256: sha256}


@dataclass(frozen=True)
class SpecBucket:
    """How the supervisor reaches the run's records: the S3 API (endpoint, region; keys in the credentials
    file), or only the platform's mount (via "mount")."""

    name: str
    endpoint: str | None = None
    region: str | None = None
    via: str | None = None
    mount: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class LaunchSpec:
    run: str
    attempt: int
    command: list[str]
    env: dict[str, str]
    bucket: SpecBucket
    node: int = 0
    memory_limit_mb: int | None = None
    cwd: str | None = None
    credentials_file: str | None = None
    log_every_s: float = 3.0  # how often the supervisor ships new log bytes to the bucket

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"run": self.run, "attempt": self.attempt, "node": self.node,
                               "command": list(self.command), "env": dict(self.env),
                               "memory_limit_mb": self.memory_limit_mb, "cwd": self.cwd,
                               "bucket": self.bucket.as_dict()}
        if self.credentials_file is not None:
            doc["credentials_file"] = self.credentials_file
        if self.log_every_s != 3.0:
            doc["log_every_s"] = self.log_every_s
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> LaunchSpec:
        doc = json.loads(data)
        bucket = doc["bucket"]
        limit = doc.get("memory_limit_mb")
        return cls(run=str(doc["run"]), attempt=int(doc["attempt"]), command=[str(a) for a in doc["command"]],
                   env={str(k): str(v) for k, v in (doc.get("env") or {}).items()},
                   bucket=SpecBucket(name=bucket["name"], endpoint=bucket.get("endpoint"),
                                     region=bucket.get("region"), via=bucket.get("via"), mount=bucket.get("mount")),
                   node=int(doc.get("node", 0)), memory_limit_mb=int(limit) if limit is not None else None,
                   cwd=doc.get("cwd"),
                   credentials_file=doc.get("credentials_file"), log_every_s=float(doc.get("log_every_s", 3.0)))

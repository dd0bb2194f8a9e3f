"""The run's records the controller writes to the bucket, as types built once: the manifest (once per
run) and the attempt record (one per attempt). Their JSON is what it was (docs/design.md section 4):
`to_dict()` writes it, and a key this module does not know (one written later, or by an older gpukit)
is kept as it is in `extra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from glue.runs import config as runconfig
from glue.runs.store import RunStore, utc_iso

_R = TypeVar("_R")


def _as_dict(obj: Any) -> dict[str, Any]:
    out = {f.name: getattr(obj, f.name) for f in fields(obj) if f.name != "extra"}
    return {**out, **obj.extra}


def _from_dict(cls: type[_R], doc: dict[str, Any]) -> _R:
    """A record as read back: the keys this module knows as fields, every other one kept in `extra`."""
    known = {f.name for f in fields(cls)} - {"extra"}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in doc.items() if k in known},  # type: ignore[call-arg]
               extra={k: v for k, v in doc.items() if k not in known})


@dataclass
class Manifest:
    """manifest.json: what the run is (config, code, requirements, environment), written once at deploy."""

    run: str
    runtime: str
    command: list[str]
    config: dict[str, Any]
    environment: dict[str, Any]
    created_at: str = field(default_factory=utc_iso)
    image: str | None = None
    image_digest: str | None = None
    input: dict[str, Any] | None = None
    code: dict[str, Any] | None = None  # the deploying project's git sha (glue.runs.deploy.git_version)
    distributed: dict[str, Any] | None = None
    secrets: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    bucket: dict[str, Any] = field(default_factory=dict)
    # The evaluation set as verified at deploy (its sha256 pinned): runs judged on different sets are
    # refused by `glue compare`.
    evaluation: dict[str, Any] = field(default_factory=dict)
    # The user's code and resolved requirements by content hash: every later attempt (recovery, glue
    # watch, another node) brings back exactly these, from the bucket.
    workdir: dict[str, Any] | None = None
    requirements: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_run(cls, store: RunStore, rc: runconfig.RunConfig, environment: dict[str, Any],
               eval_pin: dict[str, Any] | None, **pins: Any) -> Manifest:
        """The manifest of a new run of `rc`; `pins`: image_digest, code, distributed, workdir, requirements."""
        return cls(run=store.run, runtime=rc.runtime, command=list(rc.command), config=rc.as_dict(),
                   environment=environment, image=rc.image, input=rc.input.model_dump() if rc.input else None,
                   secrets=list(rc.secrets),
                   outputs={"destination": rc.outputs.destination, "required": list(rc.outputs.required)},
                   checkpoint=rc.checkpoint.model_dump(),
                   bucket={"endpoint": store.info.endpoint, "name": store.info.name},
                   evaluation={"dataset": eval_pin,
                               "metrics": rc.evaluation.model_dump()["metrics"] if rc.evaluation else {}},
                   **pins)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass
class AttemptRecord:
    """attempts/<n>.json: where and how attempt n started; the monitor adds how it ended."""

    run: str
    attempt: int
    vm: str
    vm_id: str | None
    backend: str
    resume: bool
    nodes: list[dict[str, Any]]
    started_at: str = field(default_factory=utc_iso)
    memory_limit_mb: int | None = None
    ended_at: str | None = None
    exit: Any = None
    failure_class: str | None = None
    last_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # rendezvous, execution, pids, incident, outcome...

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AttemptRecord:
        return _from_dict(cls, doc)


@dataclass
class RecoveryRecord:
    """recoveries/<k>.json: one `glue recover` — what failed, where the run went, what each phase took,
    the work lost and the resume check's verdict."""

    run: str
    failed_attempt: int
    new_attempt: int
    failure_class: str
    old_vm: dict[str, Any]
    new_vm: dict[str, Any]
    nodes: list[dict[str, Any]]
    dropped_vms: list[str]
    world_size: int
    resume_check: dict[str, Any]
    rendezvous: str | None
    checkpoint_step: int | None
    failure_step: int
    seconds: dict[str, float | None]
    work_lost: dict[str, Any]
    verified: bool
    first_resumed_step: int | None
    compared_steps: list[int]
    problem: str | None
    tolerance: float
    spares: list[dict[str, Any]] = field(default_factory=list)
    kept_vm: dict[str, Any] | None = None
    kept_vms: list[dict[str, Any]] = field(default_factory=list)
    recorded_at: str = field(default_factory=utc_iso)
    extra: dict[str, Any] = field(default_factory=dict)  # rejected_checkpoints, reject_problem after a bad restart

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RecoveryRecord:
        return _from_dict(cls, doc)


def nodes_of(attempt: dict[str, Any]) -> list[dict[str, Any]]:
    """The VMs of an attempt: its `nodes` (a group), or the one VM of a single-node attempt."""
    return list(attempt.get("nodes") or [{"node": 0, "vm": attempt.get("vm"), "vm_id": attempt.get("vm_id")}])

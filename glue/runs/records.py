"""The run's records the controller writes to the bucket, as types built once and read through their
attributes: the manifest (once per run), the attempt record (one per attempt, with an AttemptNode per VM it
ran on) and the recovery record (one per recovery). Their JSON is what it was (docs/design.md section 4):
`to_dict()` writes it, `from_dict()` reads it back, and nothing else in glue/ reads one of their keys by name
(`python -m tests.lint_record_keys`).

Old records still read: a key this module does not know (one written later, or by an older gpukit) is kept
as it is in `extra`; a key an older record lacks reads as its field's default and is not written back
unless it was set; an optional field (metadata OPT) is written only when it holds a value, or when the record
read held it as null.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Protocol, TypeVar

from glue.bucket_access import BucketInfo
from glue.runs import config as runconfig
from glue.runs.clock import utc_iso

_R = TypeVar("_R")
_OMIT = "omit_when_none"
# An optional field (`field(default=None, metadata=OPT)`): a key written only by some records, or only once it
# happened, absent from the JSON while None.
OPT = {_OMIT: True}
# A list field whose entries are records of their own (`field(metadata={_ITEMS: their type})`): read with its
# `from_dict`, written with their `to_dict`.
_ITEMS = "items"


class RunPlace(Protocol):
    """Where a run's records are (a RunStore): its id and its bucket."""

    run: str
    info: BucketInfo


def _omit(f: Field[Any], value: Any) -> bool:
    return bool(f.metadata.get(_OMIT)) and value is None


def _entries_out(f: Field[Any], value: Any) -> Any:
    return [v.to_dict() for v in value] if f.metadata.get(_ITEMS) and isinstance(value, list) else value


def _entries_in(f: Field[Any], value: Any) -> Any:
    kind = f.metadata.get(_ITEMS)
    return [kind.from_dict(v) for v in value] if kind and isinstance(value, list) else value


def _as_dict(obj: Any) -> dict[str, Any]:
    """The record's JSON: the keys it read and did not know, then every field but the unset optional ones and
    the ones the record read did not have (unless set since)."""
    out = dict(obj.extra)
    absent: dict[str, Any] = getattr(obj, "_absent", {})
    null: dict[str, Any] = getattr(obj, "_null", {})
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name == "extra" or _omit(f, value) or (f.name in absent and absent[f.name] == value):
            continue
        out[f.name] = None if f.name in null and null[f.name] == value else _entries_out(f, value)
    return out


def _update(rec: Any, values: dict[str, Any]) -> None:
    known = {f.name: f for f in fields(rec) if f.name != "extra"}
    for name, value in values.items():
        if name not in known:
            raise TypeError(f"{type(rec).__name__} has no field {name!r}")
        setattr(rec, name, value)
        getattr(rec, "_absent", {}).pop(name, None)  # set now: written, whatever it holds
        if _omit(known[name], value):
            rec.extra[name] = None


def _default(f: Field[Any], defaults: dict[str, Any]) -> Any:
    """What a field of a record read back holds when the record lacks it: the reader's default, else the
    field's own (a timestamp field's reader gives "", never the time it was read)."""
    if f.name in defaults:
        return defaults[f.name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _from_dict(cls: type[_R], doc: dict[str, Any], defaults: dict[str, Any]) -> _R:
    """A record as read back: the keys this module knows as fields, every other one (and an optional key
    stored as null) kept in `extra`; a required key the record lacks takes its value from `defaults`, and a
    block (dict, list) stored as null reads empty (both written back as they were while unchanged)."""
    known = {f.name: f for f in fields(cls) if f.name != "extra"}  # type: ignore[arg-type]
    mine = {k: _entries_in(known[k], v) for k, v in doc.items() if k in known and not _omit(known[k], v)}
    null = {k: empty for k, v in mine.items() if v is None and (empty := _default(known[k], defaults)) is not None}
    missing = {k: _default(f, defaults) for k, f in known.items() if k not in doc}
    rec = cls(**missing, **mine | null, extra={k: v for k, v in doc.items() if k not in mine})  # type: ignore[call-arg]
    # Copies: a block the caller fills in place (record.nodes.append) differs from what was read.
    object.__setattr__(rec, "_absent", copy.deepcopy(missing))
    object.__setattr__(rec, "_null", copy.deepcopy(null))
    return rec


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
    # How the run's group changed (a recovery onto fewer VMs): [{attempt, from, to, at}], oldest first.
    group_changes: list[dict[str, Any]] | None = field(default=None, metadata=OPT)
    # The Slurm job of a run submitted to Slurm (glue.scheduler.slurm).
    scheduler: dict[str, Any] | None = field(default=None, metadata=OPT)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_run(cls, store: RunPlace, rc: runconfig.RunConfig, environment: dict[str, Any],
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

    @classmethod
    def from_dict(cls, doc: dict[str, Any], run: str = "") -> Manifest:
        """A manifest as stored (RunStore checked its `config`); keys an old one lacks read as empty."""
        return _from_dict(cls, doc, {"run": run, "runtime": "process", "command": [], "config": {},
                                     "environment": {}, "created_at": ""})

    @property
    def monitor(self) -> dict[str, Any]:
        """The run config's `monitor` block (heartbeat, stall timeout), {} when it set none."""
        return dict(self.config.get("monitor") or {})


@dataclass
class AttemptNode:
    """One VM of an attempt (an entry of the attempt record's `nodes`): node k of the group, its VM, what was
    prepared there and what its supervisor reported once it started the trainer (its pids file)."""

    node: int
    vm: str
    vm_id: str | None
    # The run's code and requirements as prepared on this node (a run with a workdir or requirements).
    code_sha256: str | None = field(default=None, metadata=OPT)
    requirements_set: str | None = field(default=None, metadata=OPT)
    docker_gpus: bool | None = field(default=None, metadata=OPT)  # runtime docker: `docker run --gpus all`
    # The supervisor's pids file: its pid and the trainer's, when it started the trainer, and how (a warm
    # spare's waiting process took the attempt, or it started cold and why).
    supervisor_pid: int | None = field(default=None, metadata=OPT)
    trainer_pid: int | None = field(default=None, metadata=OPT)
    started_at: str | None = field(default=None, metadata=OPT)
    start: str | None = field(default=None, metadata=OPT)
    cold_reason: str | None = field(default=None, metadata=OPT)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this module does not know

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AttemptNode:
        """A node entry as stored; keys an old one lacks read as empty."""
        return _from_dict(cls, doc, {"node": 0, "vm": "", "vm_id": None})

    def update(self, **values: Any) -> None:
        """Set fields by name; an optional one set to None is written as null (as the dict it replaced)."""
        _update(self, values)

    def add_pids(self, pids: dict[str, Any]) -> None:
        """The node's pids file as its supervisor wrote it: the keys this type knows set as fields, any other
        kept as it is (written back with the node)."""
        known = {f.name for f in fields(self)} - {"extra"}
        self.update(**{k: v for k, v in pids.items() if k in known})
        self.extra.update({k: v for k, v in pids.items() if k not in known})


@dataclass
class AttemptRecord:
    """attempts/<n>.json: where and how attempt n started; the monitor adds how it ended."""

    run: str
    attempt: int
    vm: str
    vm_id: str | None
    backend: str
    resume: bool
    nodes: list[AttemptNode] = field(metadata={_ITEMS: AttemptNode})  # []: none named (nodes_of: its one VM)
    started_at: str = field(default_factory=utc_iso)
    memory_limit_mb: int | None = None
    ended_at: str | None = None
    exit: Any = None
    failure_class: str | None = None
    last_step: int | None = None
    # How it ended: the monitor's verdict (or glue stop's, a Slurm requeue's) and the incident it wrote.
    outcome: str | None = field(default=None, metadata=OPT)
    reason: str | None = field(default=None, metadata=OPT)
    signal: int | None = field(default=None, metadata=OPT)
    incident: str | None = field(default=None, metadata=OPT)
    # How it started: the group's rendezvous, a serverless execution, the Slurm job, the trainer's pids.
    rendezvous: str | None = field(default=None, metadata=OPT)
    execution: dict[str, Any] | None = field(default=None, metadata=OPT)
    scheduler: dict[str, Any] | None = field(default=None, metadata=OPT)
    supervisor_pid: int | None = field(default=None, metadata=OPT)
    trainer_pid: int | None = field(default=None, metadata=OPT)
    code_sha256: str | None = field(default=None, metadata=OPT)
    requirements_set: str | None = field(default=None, metadata=OPT)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this module does not know

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AttemptRecord:
        """An attempt record as stored; keys an old one lacks read as empty (a VM-less, fresh-start attempt)."""
        return _from_dict(cls, doc, {"run": "", "vm": "", "vm_id": None, "backend": "local", "resume": False,
                                     "nodes": [], "started_at": ""})

    def update(self, **values: Any) -> None:
        """Set fields by name, as the monitor, glue stop and a Slurm requeue record how the attempt ended; an
        optional one set to None is written as null (as the dict this record replaced wrote it)."""
        _update(self, values)

    @property
    def ended(self) -> bool:
        """Whether the attempt is over: classified, or recorded completed."""
        return bool(self.outcome or self.failure_class)

    @property
    def execution_id(self) -> str | None:
        """The serverless execution the attempt is (None: it ran on VMs, or its start's answer was lost)."""
        return (self.execution or {}).get("id")


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
    # After a bad restart: the checkpoints the wrong resume committed, marked rejected (and why marking failed).
    rejected_checkpoints: list[int] | None = field(default=None, metadata=OPT)
    reject_problem: str | None = field(default=None, metadata=OPT)
    bad_restart: bool | None = field(default=None, metadata=OPT)  # a Slurm restart whose resume failed its check
    scheduler: dict[str, Any] | None = field(default=None, metadata=OPT)  # the Slurm job a requeue restarted
    extra: dict[str, Any] = field(default_factory=dict)  # keys this module does not know

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    def update(self, **values: Any) -> None:
        """Set fields by name; an optional one set to None is written as null."""
        _update(self, values)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RecoveryRecord:
        """A recovery record as stored; keys an old one lacks read as empty."""
        return _from_dict(cls, doc, {"run": "", "failed_attempt": 0, "new_attempt": 0, "failure_class": "",
                                     "old_vm": {}, "new_vm": {}, "nodes": [], "dropped_vms": [], "world_size": 1,
                                     "resume_check": {}, "rendezvous": None, "checkpoint_step": None,
                                     "failure_step": 0, "seconds": {}, "work_lost": {}, "verified": False,
                                     "first_resumed_step": None, "compared_steps": [], "problem": None,
                                     "tolerance": 0.0, "recorded_at": ""})


def nodes_of(attempt: AttemptRecord) -> list[AttemptNode]:
    """The VMs of an attempt: its `nodes` (a group), or the one VM of a single-node attempt."""
    return list(attempt.nodes or [AttemptNode(node=0, vm=attempt.vm, vm_id=attempt.vm_id)])

"""The run config (run.yaml): validated by pydantic models (types, ranges, unknown keys), every
problem reported as one line naming the key. The user's own `config:` block is the trainer's business
(handed over as GPUKIT_CONFIG); everything else is the kit's and is checked here.
docs/run-config.schema.json is generated from these models (`python -m glue.runs.config --schema`).

```yaml
command: [python, -m, glue.examples.tiny_gpt]   # or image: for the docker runtime
runtime: process                                # process | docker | lyceum-run (a serverless run per attempt)
config: {steps: 200, batch_size: 16}            # handed to the trainer (GPUKIT_CONFIG)
input: {uri: builtin://tiny-corpus, version: v1}
outputs: {destination: "s3://gpukit/runs/{run}/outputs", required: [model.pt]}
checkpoint: {target: "s3://gpukit/runs/{run}", interval_steps: 20, keep_last: 2}
env: {OMP_NUM_THREADS: "1"}
secrets: [WANDB_API_KEY]                        # names only; values come from the environment
monitor: {heartbeat_seconds: 2, stall_timeout_seconds: 60, lost_after_seconds: 5}
recovery: {max_preemptions: 10, max_failures: 3, backoff_seconds: 10, deadline_hours: 48}   # glue watch
notify: {command: [notify-send-ish, --json], webhook_env: TEAM_WEBHOOK_URL}
evaluation:
  dataset: {uri: "s3://gpukit/eval/heldout-v1.bin", sha256: "<64 hex>"}   # pinned in the manifest
  metrics: {val_loss: {max: 4.5}}                                          # acceptance thresholds
pricing: {vm_hour: 2.1, currency: EUR}    # overrides the backend's price table
workdir: .                                # your code: packed, pinned in the bucket, unpacked on every VM
requirements: requirements.txt            # a file in the workdir, or a list; installed from a pinned wheelhouse
execution: {type: gpu.a100, timeout: 600, timeout_unit_seconds: 1, save_margin_seconds: 60}   # lyceum-run
resources: {gpus_per_node: 1, nodes: 1, cpus_per_gpu: 2, mem_per_gpu: 8G, time: "02:00:00"}   # a Slurm cluster
memprobe: {remedies: {grad_accum: {grad_accum: 4}}}   # how your code takes a memory remedy (glue memprobe)
```
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from glue import yamlfile
from glue.errors import GlueError, yaml_problem
from glue.runs.config_errors import one_line
from glue.runs.config_memprobe import MemprobeSpec
from glue.runs.config_resources import ResourcesSpec

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SECRET_NAME_RE = r"^[A-Z_][A-Z0-9_]*$"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "run-config.schema.json"
STARTUP_TIMEOUT_S = 300.0  # monitor.startup_timeout_seconds' default

NonEmpty = Annotated[StrictStr, StringConstraints(min_length=1)]


class _Strict(BaseModel):
    """Unknown keys are errors; numbers and strings are not coerced from other types (StrictInt/StrictStr)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """The training data and its version (recorded in the manifest)."""

    uri: NonEmpty
    version: Annotated[StrictStr, Field(min_length=1)]

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


class OutputsSpec(_Strict):
    """Where the trainer exports results, and which files must be there before a run counts as done."""

    destination: NonEmpty
    required: tuple[NonEmpty, ...] = ()


class CheckpointSpec(_Strict):
    """Where checkpoints go (must be in the bucket), how often, and how many valid ones to keep."""

    target: NonEmpty
    interval_steps: Annotated[StrictInt, Field(ge=1, le=10_000_000)] = 50
    keep_last: Annotated[StrictInt, Field(ge=2, le=1000)] = 2


class MonitorSpec(_Strict):
    """Heartbeat period, the stall timeout, the trainer's budget to its first step, when a VM counts as lost."""

    heartbeat_seconds: Annotated[float, Field(ge=0.1, le=3600)] = 2.0
    stall_timeout_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = 60.0
    startup_timeout_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = STARTUP_TIMEOUT_S
    lost_after_seconds: Annotated[float, Field(gt=0, le=24 * 3600)] = 5.0

    @field_validator("*", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"must be a number of seconds, got {v!r}")
        return v

    @model_validator(mode="after")
    def _stall_after_heartbeats(self) -> MonitorSpec:
        if self.stall_timeout_seconds < 2 * self.heartbeat_seconds:
            raise ValueError(f"stall_timeout_seconds ({self.stall_timeout_seconds:g}) must be at least twice "
                             f"heartbeat_seconds ({self.heartbeat_seconds:g}), or a healthy run reads as stalled")
        if self.lost_after_seconds <= self.heartbeat_seconds:
            raise ValueError(f"lost_after_seconds ({self.lost_after_seconds:g}) must be more than "
                             f"heartbeat_seconds ({self.heartbeat_seconds:g}), or a live VM reads as lost")
        return self


NOTIFY_EVENTS = ("recovered", "recovery_failed", "budget_exhausted", "bad_restart", "oom", "failed")
HTTP_URL_RE = r"^https?://[^\s]+$"
SHA256_RE = r"^[0-9a-f]{64}$"
Count = Annotated[StrictInt, Field(ge=0, le=100_000)]


def _seconds(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"must be a number, got {v!r}")
    return v


class RecoverySpec(_Strict):
    """What `glue watch` may do unattended. Lost VMs (preemption) and real failures (stall, comm, lost
    storage) draw on separate budgets; attempts wait backoff_seconds, doubling up to backoff_max_seconds;
    past deadline_hours after the run's first start nothing more is tried."""

    max_preemptions: Count = 10
    max_failures: Count = 3
    backoff_seconds: Annotated[float, Field(ge=0, le=24 * 3600)] = 10.0
    backoff_max_seconds: Annotated[float, Field(ge=0, le=7 * 24 * 3600)] = 300.0
    deadline_hours: Annotated[float, Field(gt=0, le=24 * 365)] | None = None
    keep_failed: StrictBool = False
    # A multi-VM run whose lost VMs cannot be replaced (no capacity) continues on its surviving VMs when at
    # least this many are left (glue recover --nodes; the checkpoint restores at the smaller world size).
    min_nodes: Annotated[StrictInt, Field(ge=1, le=10_000)] | None = None

    @field_validator("backoff_seconds", "backoff_max_seconds", "deadline_hours", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        return v if v is None else _seconds(v)

    @model_validator(mode="after")
    def _backoff_order(self) -> RecoverySpec:
        if self.backoff_max_seconds < self.backoff_seconds:
            raise ValueError(f"backoff_max_seconds ({self.backoff_max_seconds:g}) must be at least "
                             f"backoff_seconds ({self.backoff_seconds:g})")
        return self


class NotifySpec(_Strict):
    """Who hears about recoveries and failures: a command (the event as JSON on stdin) and/or a webhook
    (an HTTP POST of the same JSON). webhook_env names an environment variable of the watcher that holds
    the URL, for URLs that carry a token (it is never recorded)."""

    command: tuple[NonEmpty, ...] = ()
    webhook: Annotated[StrictStr, StringConstraints(pattern=HTTP_URL_RE)] | None = None
    webhook_env: Annotated[StrictStr, StringConstraints(pattern=SECRET_NAME_RE)] | None = None
    events: tuple[Literal[NOTIFY_EVENTS], ...] = NOTIFY_EVENTS  # type: ignore[valid-type]

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        return v.split() if isinstance(v, str) else v


class EvalSetSpec(_Strict):
    """The fixed evaluation set: one object in the bucket, pinned by its sha256."""

    uri: NonEmpty
    sha256: Annotated[StrictStr, StringConstraints(pattern=SHA256_RE)]


class Threshold(_Strict):
    """An acceptance criterion on one metric: min and/or max (inclusive)."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _some_bound(self) -> Threshold:
        if self.min is None and self.max is None:
            raise ValueError("give min and/or max")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) is above max ({self.max:g})")
        return self


class EvaluationSpec(_Strict):
    """The evaluation that decides whether a run is accepted: a pinned set and metric thresholds."""

    dataset: EvalSetSpec | None = None
    metrics: Annotated[dict[str, Threshold], Field(min_length=1)]


class PricingSpec(_Strict):
    """Overrides the backend's price table for this run's cost figures."""

    vm_hour: Annotated[float, Field(ge=0, le=100_000)]
    currency: Annotated[StrictStr, StringConstraints(pattern=r"^[A-Z]{3}$")] = "EUR"


class WorkdirSpec(_Strict):
    """The user's code: a folder (relative to the run config's folder) packed and shipped with every attempt."""

    path: NonEmpty = "."
    max_size_mb: Annotated[StrictInt, Field(ge=1, le=10_240)] = 256
    secret_files: tuple[NonEmpty, ...] = ()  # secret-looking files shipped on purpose (paths in the workdir)


class ExecutionSpec(_Strict):
    """`runtime: lyceum-run`: Lyceum's serverless run per attempt, and its cap (docs/lyceum.md, section 8)."""

    type: Annotated[StrictStr, StringConstraints(pattern=r"^[a-zA-Z0-9_.]+$")] = "gpu.a100"
    timeout: Annotated[StrictInt, Field(ge=1, le=600)] = 600  # Lyceum's cap of one execution, in its unit
    timeout_unit_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0  # the unit is undocumented: seconds is safe
    save_margin_seconds: Annotated[float, Field(ge=0, le=3600)] = 60.0  # save and stop this long before the cap

    @property
    def cap_seconds(self) -> float:
        return self.timeout * self.timeout_unit_seconds


class RunConfig(_Strict):
    """A whole run.yaml. `parse()` substitutes {run} and {bucket} in the locations."""

    command: tuple[str, ...] = ()
    image: NonEmpty | None = None
    runtime: Literal["process", "docker", "lyceum-run"] = "process"
    config: dict[str, Any] = Field(default_factory=dict)
    input: InputSpec | None = None
    outputs: OutputsSpec
    checkpoint: CheckpointSpec
    env: dict[str, str] = Field(default_factory=dict)
    secrets: tuple[Annotated[StrictStr, StringConstraints(pattern=SECRET_NAME_RE)], ...] = ()
    monitor: MonitorSpec = Field(default_factory=MonitorSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    notify: NotifySpec = Field(default_factory=NotifySpec)
    evaluation: EvaluationSpec | None = None
    pricing: PricingSpec | None = None
    workdir: WorkdirSpec | None = None
    requirements: NonEmpty | tuple[NonEmpty, ...] | None = None
    execution: ExecutionSpec | None = None
    resources: ResourcesSpec | None = None
    memprobe: MemprobeSpec | None = None

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, str) else v

    @field_validator("requirements", mode="before")
    @classmethod
    def _requirements(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
            raise ValueError("must be a requirements file in the workdir, or a list of requirements")
        return tuple(v)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.split()
        if not isinstance(v, list | tuple) or not all(isinstance(c, str | int | float) and not isinstance(c, bool)
                                                      for c in v):
            raise ValueError("must be a list of strings (or one string)")
        return tuple(str(c) for c in v)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise ValueError("must be a mapping of NAME: value")
        return {k: str(x) for k, x in v.items()}

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, v: Any) -> Any:
        if not isinstance(v, list | tuple):
            raise ValueError("must be a list of environment variable NAMES (values never go in run.yaml)")
        return tuple(v)

    @model_validator(mode="after")
    def _runnable(self) -> RunConfig:
        if not self.command and not self.image:
            raise ValueError("missing command: set `command:` (process runtime) or `image:` (docker runtime)")
        if self.runtime == "docker" and not self.image:
            raise ValueError("runtime docker needs `image:` (build it from images/trainer/Dockerfile)")
        if self.runtime != "process" and self.requirements:
            raise ValueError(f"requirements: needs `runtime: process`; a {self.runtime} trainer's packages belong in "
                             "its image")
        if self.runtime == "lyceum-run" and (not self.image or not self.command or self.workdir):
            raise ValueError("runtime lyceum-run needs `image:` (with gpukit's trainer library and your code) and "
                             "`command:`, and ships no `workdir:` (put the code in the image)")
        if self.execution is not None and self.runtime != "lyceum-run":
            raise ValueError("execution: goes with `runtime: lyceum-run`")
        if self.execution is not None and self.execution.save_margin_seconds >= self.execution.cap_seconds:
            raise ValueError("execution.save_margin_seconds must be below the cap (timeout x timeout_unit_seconds)")
        if self.resources is not None and self.runtime != "process":
            raise ValueError("resources: goes with `runtime: process` (a Slurm batch job runs the command on its "
                             "nodes)")
        return self

    def locations(self) -> dict[str, str]:
        """Every place the run writes durable data: each must be in the bucket."""
        return {"checkpoint.target": self.checkpoint.target, "outputs.destination": self.outputs.destination}

    def as_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        out["input"] = self.input.model_dump() if self.input else None
        return out

    def with_config(self, overrides: dict[str, Any]) -> RunConfig:
        return self.model_copy(update={"config": {**self.config, **overrides}})


def parse(raw: Any, run_id: str, bucket: str) -> RunConfig:
    """Validate a loaded run.yaml; `{run}` and `{bucket}` in locations are substituted."""
    if not isinstance(raw, dict):
        raise GlueError("run config must be a mapping of settings (see examples/tiny_gpt.yaml), "
                        f"got {type(raw).__name__}")
    try:
        rc = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise GlueError(f"run config: {one_line(exc, RunConfig)}") from None  # one line, no pydantic traceback

    def subst(s: str) -> str:
        return s.replace("{run}", run_id).replace("{bucket}", bucket).rstrip("/")

    update: dict[str, Any] = {
        "outputs": rc.outputs.model_copy(update={"destination": subst(rc.outputs.destination)}),
        "checkpoint": rc.checkpoint.model_copy(update={"target": subst(rc.checkpoint.target)}),
    }
    if rc.evaluation and rc.evaluation.dataset:
        ds = rc.evaluation.dataset.model_copy(update={"uri": subst(rc.evaluation.dataset.uri)})
        update["evaluation"] = rc.evaluation.model_copy(update={"dataset": ds})
    return rc.model_copy(update=update)


def check_run_id(run_id: str) -> None:
    if not RUN_ID_RE.match(run_id):
        raise GlueError(f"invalid run id {run_id!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit (e.g. r1)")


def load(path: Path, run_id: str, bucket: str) -> RunConfig:
    check_run_id(run_id)
    try:
        raw = yamlfile.load(path.read_text())
    except OSError as exc:
        raise GlueError(f"cannot read run config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise GlueError(f"{path} is not a text file (byte {exc.start} is not UTF-8): give the run config "
                        "(YAML), e.g. examples/tiny_gpt.yaml") from exc
    except yaml.YAMLError as exc:
        raise GlueError(f"{path} is not valid YAML{yaml_problem(exc)}") from exc
    if raw is None:
        raise GlueError(f"{path} is empty: a run config needs at least `outputs:` and `checkpoint:` "
                        "(see examples/tiny_gpt.yaml)")
    return parse(raw, run_id, bucket)


def runtime_of(path: Path) -> str:
    """The runtime a run config asks for, read before the bucket is known (which bucket depends on it);
    `load` reports a file that cannot be read."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "process"
    return str(raw.get("runtime") or "process") if isinstance(raw, dict) else "process"


def json_schema() -> dict[str, Any]:
    """The run config's JSON schema, for editors (docs/run-config.schema.json)."""
    schema = RunConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpukit run config (run.yaml)"
    return schema


if __name__ == "__main__":  # python -m glue.runs.config --schema > docs/run-config.schema.json
    if sys.argv[1:] != ["--schema"]:
        sys.exit("usage: python -m glue.runs.config --schema")
    print(json.dumps(json_schema(), indent=2, sort_keys=True))

"""run.yaml's `resources:`: what a run asks of a Slurm cluster (glue.scheduler.slurm turns it into sbatch's
options). Validated like the rest of the run config (glue.runs.config): unknown keys are errors, nothing
coerced but a number given for a size or a time limit."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)

# Slurm's time limit forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
SLURM_TIME_RE = r"^(\d+-)?\d+(:\d{1,2}){0,2}$"
SLURM_SIZE_RE = r"^[1-9][0-9]*[KMGT]?$"  # a memory size as sbatch takes it (megabytes without a unit)


def slurm_time_seconds(text: str) -> int:
    """A Slurm time limit (SLURM_TIME_RE) in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        h, m, s = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:  # minutes[:seconds]
        h, m, s = 0, parts[0], (parts[1] if len(parts) > 1 else 0)
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


class ResourcesSpec(BaseModel):
    """What a run asks of a Slurm cluster (`glue up --scheduler slurm`); sbatch's --gres=gpu:G, --nodes,
    --cpus-per-gpu, --mem-per-gpu and --time. notice_seconds: how long before the time limit (and on
    preemption) the job is told to save and stop (--signal=B:USR1@<seconds>)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus_per_node: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    nodes: Annotated[StrictInt, Field(ge=1, le=1024)] = 1
    cpus_per_gpu: Annotated[StrictInt, Field(ge=1, le=1024)] | None = None
    mem_per_gpu: Annotated[StrictStr, StringConstraints(pattern=SLURM_SIZE_RE)] | None = None
    time: Annotated[StrictStr, StringConstraints(pattern=SLURM_TIME_RE)] | None = None
    notice_seconds: Annotated[StrictInt, Field(ge=1, le=65535)] = 60

    @field_validator("mem_per_gpu", "time", mode="before")
    @classmethod
    def _number_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _notice_before_limit(self) -> ResourcesSpec:
        if self.time is not None and self.notice_seconds >= slurm_time_seconds(self.time):
            raise ValueError(f"notice_seconds ({self.notice_seconds}) must be below the time limit ({self.time}), "
                             "or the job is told to stop before it starts")
        return self

"""run.yaml's `memprobe:`: how the run's own code takes each memory remedy `glue memprobe` tries, as
changes to its `config:` (`remedies: {grad_accum: {grad_accum: 4}, checkpointing: {grad_ckpt: true}}`).
Each remedy is applied alone at the failing input; the names are the user's."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, StringConstraints

REMEDY_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"


class MemprobeSpec(BaseModel):
    """NAME -> the config values that remedy sets (unknown keys of `memprobe:` are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    remedies: dict[Annotated[StrictStr, StringConstraints(pattern=REMEDY_NAME)], dict[str, Any]] = Field(
        default_factory=dict)

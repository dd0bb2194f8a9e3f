"""The trainer's side of a deployed run: RunContext, the supervisor, the process group, notices.

`from glue.train.run import RunContext` loads the context on first use: the supervisor
(`python -m glue.train.run.supervise`) lives in this package and must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glue.train.run.context import RunContext


def __getattr__(name: str) -> Any:
    if name == "RunContext":
        return importlib.import_module("glue.train.run.context").RunContext
    raise AttributeError(f"module 'glue.train.run' has no attribute {name!r}")


__all__ = ["RunContext"]

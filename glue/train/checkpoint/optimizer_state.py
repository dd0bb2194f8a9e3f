"""An optimizer's state keyed by parameter name, as torch.distributed.checkpoint keys it.

`optimizer.state_dict()` keys state by parameter position and, before the first step, holds none;
torch's `get_optimizer_state_dict` keys it by the parameters' names and creates the state first, so
a checkpoint restores into a fresh optimizer, sharded (FSDP2: DTensor states) or not.
"""

from __future__ import annotations

from typing import Any

import torch


class OptimizerState:
    """Register this instead of the optimizer: `ckpt.register("optimizer", OptimizerState(model, opt))`.
    Needed for sharded models (FSDP2, tensor parallel); works for any model."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state)

"""A small MLP regressor; einops (from requirements.txt) reshapes its input."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn


class Regressor(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(self.net(x), "b 1 -> b")

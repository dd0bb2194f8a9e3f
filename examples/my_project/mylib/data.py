"""Synthetic data made here from a seed (nothing is downloaded): y = <w, x> + noise."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset


def make_dataset(n: int = 2048, features: int = 8, seed: int = 1234) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, generator=g)
    y = x @ w + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)

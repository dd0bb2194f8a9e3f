"""What a local VM costs: nothing (it is a process tree on this machine). Runs that want cost figures
anyway (to rehearse a budget) set `pricing: {vm_hour: ..., currency: ...}` in run.yaml."""

from __future__ import annotations

from pathlib import Path

CURRENCY = "EUR"


def quote(gpu_type: str, gpu_count: int, market: str = "on-demand",
          home: Path | None = None) -> tuple[float | None, str, str]:
    """(price of one VM-hour, currency, where the price came from): free."""
    return 0.0, CURRENCY, "local VMs are free"

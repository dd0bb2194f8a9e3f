"""What a local VM costs: nothing (it is a process tree on this machine). Runs that want cost figures
anyway (to rehearse a budget) set `pricing: {vm_hour: ..., currency: ...}` in run.yaml."""

from __future__ import annotations

CURRENCY = "EUR"
SOURCE = "local VMs are free"


def vm_hour(gpu_type: str, gpu_count: int) -> float | None:
    """Price of one VM-hour; None when the table has no price for this kind of VM."""
    return 0.0

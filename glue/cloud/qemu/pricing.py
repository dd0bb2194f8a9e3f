"""What a qemu VM costs: nothing (a qemu process on this machine). Runs that want cost figures anyway
set `pricing: {vm_hour: ..., currency: ...}` in run.yaml."""

from __future__ import annotations

CURRENCY = "EUR"
SOURCE = "qemu VMs on this machine are free"


def vm_hour(gpu_type: str, gpu_count: int) -> float | None:
    """Price of one VM-hour; None when the table has no price for this kind of VM."""
    return 0.0

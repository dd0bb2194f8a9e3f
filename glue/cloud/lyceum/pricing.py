"""What a Lyceum VM costs per hour, by hardware profile (the VM's gpu_type in the outputs contract).

PLACEHOLDERS, to confirm: Lyceum's published per-GPU-hour billing could not be read when this table was
written (no pricing page was reachable offline). The figures below are typical European on-demand rates
for the profiles (per GPU-hour; the `cpu` profile per VM-hour) and must be checked against the account's
billing page (https://dashboard.lyceum.technology, Billing) or `python -m glue.cloud.lyceum availability`
before they are relied on. A run's `pricing: {vm_hour: ..., currency: ...}` overrides them.
"""

from __future__ import annotations

CURRENCY = "EUR"
SOURCE = "Lyceum price table: placeholder figures, to confirm (glue/cloud/lyceum/pricing.py)"

# gpu_type -> price per GPU-hour (GPU profiles) or per VM-hour ("none": the cpu profile).
PER_GPU_HOUR: dict[str, float] = {"a100": 1.80, "h100": 2.90}
CPU_VM_HOUR = 0.25


def vm_hour(gpu_type: str, gpu_count: int) -> float | None:
    """Price of one VM-hour; None when the table has no price for this kind of VM."""
    if gpu_type in ("none", "", "cpu"):
        return CPU_VM_HOUR
    per_gpu = PER_GPU_HOUR.get(gpu_type.lower())
    return None if per_gpu is None else per_gpu * max(gpu_count, 1)

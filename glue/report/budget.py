"""`glue budget`: the projected cost of a whole run of N steps, failures included.

With the run's measured step time s, checkpoint interval k steps, save stall C, restore R and mean time
between failures M (all as `glue advise` measures them, glue/operations/recovery/advise.py):

  train      = N · s                          the steps themselves
  saves      = floor(N / k) · C               checkpoint overhead
  failures   = (train + saves) / M            expected failures over that time
  lost       = failures · (T/2 + R),  T = k·s  replayed half interval + restore, per failure
  wall       = train + saves + lost
  VM-hours   = wall / 3600 · VMs;  GPU-hours = VM-hours · GPUs per VM;  cost = VM-hours · price per VM-hour
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from glue.errors import GlueError
from glue.operations.recovery import advise
from glue.report.cost import price_for
from glue.runs.store import RunStore


@dataclass(frozen=True)
class BudgetInputs:
    steps: int
    step_s: float
    interval_steps: int
    save_stall_s: float
    restore_s: float
    mtbf_s: float
    vms: int
    gpus_per_vm: int
    vm_hour: float | None
    currency: str


def project(i: BudgetInputs) -> dict[str, Any]:
    train_s = i.steps * i.step_s
    saves_s = (i.steps // i.interval_steps) * i.save_stall_s
    failures = (train_s + saves_s) / i.mtbf_s
    per_failure_s = advise.expected_loss(i.interval_steps * i.step_s, i.restore_s)
    lost_s = failures * per_failure_s
    wall_s = train_s + saves_s + lost_s
    vm_hours = wall_s / 3600 * i.vms
    return {
        "inputs": asdict(i), "train_s": train_s, "checkpoint_s": saves_s, "expected_failures": failures,
        "lost_per_failure_s": per_failure_s, "lost_s": lost_s, "wall_s": wall_s, "vm_hours": vm_hours,
        "gpu_hours": vm_hours * i.gpus_per_vm, "cost": None if i.vm_hour is None else vm_hours * i.vm_hour,
        "currency": i.currency,
    }


def inputs_from_run(store: RunStore, steps: int, mtbf_hours: float | None,
                    restore_s: float | None) -> tuple[BudgetInputs, dict[str, str]]:
    """The run's measured figures (advise.measure) as budget inputs, and where each came from."""
    m = advise.measure(store)
    manifest = store.read_manifest()
    if m.step_s is None:
        raise GlueError(f"run {store.run} has no two consecutive steps recorded yet, so no measured step time")
    if m.saves == 0:
        raise GlueError(f"run {store.run} has no committed checkpoint yet, so no measured save cost")
    mtbf, mtbf_src = advise.mtbf_of(store.run, m, mtbf_hours)
    r = restore_s if restore_s is not None else m.restore_s
    if r is None:
        raise GlueError(f"run {store.run} has no measured restore yet (no `glue recover`); pass --restore-seconds")
    price = price_for(manifest)
    env = manifest.environment
    dist = manifest.distributed
    vms = int(dist.get("nodes", 1)) if isinstance(dist, dict) else 1
    sources = {"mtbf": mtbf_src, "restore": "given (--restore-seconds)" if restore_s is not None else
               "measured by glue recover", "price": price.source, "step": "median of the run's steps",
               "save_stall": f"mean of {m.saves} committed checkpoint(s)"}
    return BudgetInputs(steps=steps, step_s=m.step_s, interval_steps=m.interval_steps, save_stall_s=m.save_stall_s,
                        restore_s=r, mtbf_s=mtbf, vms=vms, gpus_per_vm=int(env.get("gpu_count") or 0),
                        vm_hour=price.vm_hour, currency=price.currency), sources

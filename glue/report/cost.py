"""Resources and cost of a run, summed across its attempts and recoveries.

  VM-hours   each attempt from its start to its end (exit record; for a lost VM its last sign of life)
             x its VMs, plus each recovery's new VMs from creation to the new attempt's start
             (provision + configure + verify)
             and each warm spare a recovery took, from when it was ready to when it took over (its wait:
             a spare serves every run of the cluster, and is charged to the run that used it)
  GPU-hours  VM-hours x GPUs per VM
  cost       VM-hours x the price of a VM-hour: run.yaml `pricing.vm_hour`, else the backend's
             (glue/cloud/<backend>/pricing.py `quote`: Lyceum's GET /pricing as cached, else its recorded table)
Replayed work (steps trained again after each failure) and checkpoint overhead (save stall x saves) are
reported beside it: they are part of the VM-hours, not added to them.
"""

from __future__ import annotations

import importlib
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from glue import paths
from glue.report.facts import RECOVERY_VM_PHASES, RunFacts
from glue.runs.records import Manifest
from glue.runs.store import parse_iso


@dataclass(frozen=True)
class Price:
    vm_hour: float | None   # None: unknown for this VM kind (cost not shown)
    currency: str
    source: str


def price_for(manifest: Manifest) -> Price:
    override = manifest.config.get("pricing")
    if override:
        return Price(float(override["vm_hour"]), str(override.get("currency") or "EUR"), "run.yaml pricing")
    env = manifest.environment
    backend = str(env.get("backend") or "local")
    try:
        table = importlib.import_module(f"glue.cloud.{backend}.pricing")
    except ModuleNotFoundError:
        return Price(None, "EUR", f"no price table for backend {backend}")
    # The kit home holds a backend's cached price list (Lyceum's GET /pricing).
    return Price(*table.quote(str(env.get("gpu_type") or "none"), int(env.get("gpu_count") or 0),
                              str(env.get("market") or "on-demand"), paths.home()))


@dataclass(frozen=True)
class Use:
    label: str          # "attempt 2" or "recovery 1"
    seconds: float
    vms: int
    vm_hours: float
    gpu_hours: float
    cost: float | None


@dataclass
class Resources:
    uses: list[Use]
    vm_hours: float
    gpu_hours: float
    cost: float | None
    price: Price
    replayed_steps: int
    replayed_s: float
    checkpoint_overhead_s: float
    saves: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _use(label: str, seconds: float, vms: int, gpus_per_vm: int, price: Price) -> Use:
    vm_hours = seconds / 3600 * vms
    return Use(label, seconds, vms, vm_hours, vm_hours * gpus_per_vm,
               None if price.vm_hour is None else vm_hours * price.vm_hour)


def resources(f: RunFacts) -> Resources:
    price = price_for(f.manifest)
    uses = [_use(f"attempt {a.n}", a.seconds, a.nodes, f.gpu_count, price) for a in f.attempts]
    for k, rec in enumerate(f.recoveries, 1):
        secs = sum(float(rec.seconds.get(p) or 0) for p in RECOVERY_VM_PHASES)
        new_vms = sum(1 for n in rec.nodes if n.get("replaced")) or 1
        uses.append(_use(f"recovery {k}", secs, new_vms, f.gpu_count, price))
        for spare in rec.spares:
            if spare.get("idle_since") and spare.get("taken_at"):
                idle = (parse_iso(spare["taken_at"]) - parse_iso(spare["idle_since"])).total_seconds()
                uses.append(_use(f"spare {spare['spare']} (recovery {k})", max(idle, 0.0), 1, f.gpu_count, price))
    stalls = [c.stall_s for c in f.checkpoints]
    saves = f.saves()
    return Resources(
        uses=uses, vm_hours=sum(u.vm_hours for u in uses), gpu_hours=sum(u.gpu_hours for u in uses),
        cost=None if price.vm_hour is None else sum(u.cost or 0.0 for u in uses), price=price,
        replayed_steps=sum(int(r.work_lost.get("steps") or 0) for r in f.recoveries),
        replayed_s=sum(float(r.work_lost.get("seconds") or 0) for r in f.recoveries),
        checkpoint_overhead_s=(statistics.mean(stalls) if stalls else 0.0) * saves, saves=saves)


def money(value: float | None, currency: str) -> str:
    return "—" if value is None else f"{value:,.4f} {currency}" if value < 1 else f"{value:,.2f} {currency}"

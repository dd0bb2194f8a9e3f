"""What `GET /vms/availability` offers, and whether it covers what `glue up` is about to ask for.

Two answer shapes are read. The guide (docs.lyceum.technology/docs/vms/api) documents
`available_hardware_profiles`: one entry per profile with `hardware_profile`, `available`, `total`,
`gpu_type`, `vcpu`, `memory_gb`. The generated API reference answers `available_instance_variants`:
`hardware_profile`, `instance_type`, `price_per_hour`, `available_gpus_per_instance`. The live API sends
both (2026-07/08): the variants are read then, since spot and on-demand are separate pools whose capacity
differs (a variant with no GPUs listed has none now; a variant not listed does not exist: l40s has no spot).
The profiles alone say nothing about the pool and cover either.

Pure (no I/O): the backend asks the API, this module judges the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glue.cloud.lyceum.spec import GPU_PROFILES, ON_DEMAND


@dataclass(frozen=True)
class Offer:
    profile: str
    available: int | None = None  # free units (GPUs on a GPU profile); None: the answer does not say
    total: int | None = None
    gpu_counts: tuple[int, ...] | None = None  # GPUs per VM on offer; None: the answer does not say
    instance_type: str = ""  # the pool (on-demand, spot); "": the answer does not say (either)

    def covers(self, gpu_count: int) -> bool:
        if self.available is not None and self.available < max(1, gpu_count if self.profile in GPU_PROFILES else 1):
            return False
        if self.gpu_counts is not None and self.profile in GPU_PROFILES:
            return gpu_count in self.gpu_counts
        return True

    def describe(self) -> str:
        parts = [self.instance_type] if self.instance_type else []
        if self.available is not None:
            parts.append(f"{self.available}" + (f" of {self.total}" if self.total is not None else "") + " free")
        if self.gpu_counts:
            parts.append(f"{', '.join(str(c) for c in sorted(self.gpu_counts))} GPUs")
        return f"{self.profile} ({': '.join(parts)})" if parts else self.profile


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def offers(doc: Any) -> list[Offer]:
    """The variants when the answer has them (they know the pool), else the profiles; entries that are not
    objects are skipped."""
    if not isinstance(doc, dict):
        return []
    out: list[Offer] = []
    for entry in doc.get("available_instance_variants") or []:
        if isinstance(entry, dict) and entry.get("hardware_profile"):
            raw = entry.get("available_gpus_per_instance")
            counts = None if not isinstance(raw, list) else tuple(c for c in map(_int, raw) if c is not None)
            out.append(Offer(str(entry["hardware_profile"]).lower(), gpu_counts=counts,
                             instance_type=str(entry.get("instance_type") or ON_DEMAND).lower()))
    if out:
        return out
    for entry in doc.get("available_hardware_profiles") or []:
        if isinstance(entry, dict) and entry.get("hardware_profile"):
            out.append(Offer(str(entry["hardware_profile"]).lower(), available=_int(entry.get("available")),
                             total=_int(entry.get("total"))))
    return out


def _room(o: Offer) -> bool:
    """Some capacity now (a GPU variant listing no GPU counts has none; the cpu profile lists none at all)."""
    return (o.available is None or o.available > 0) and (o.gpu_counts != () or o.profile not in GPU_PROFILES)


def _want(profile: str, gpu_count: int, market: str = ON_DEMAND) -> str:
    what = f"{profile} with {gpu_count} GPU{'s' if gpu_count != 1 else ''}" if profile in GPU_PROFILES else profile
    return what if market == ON_DEMAND else f"{what} as {market}"


def _in(o: Offer, market: str) -> bool:
    return o.instance_type in ("", market)


def _alternatives(found: list[Offer], profile: str, market: str = ON_DEMAND) -> str:
    with_room = [o for o in found if _room(o)]
    others = sorted({o.profile for o in with_room if o.profile != profile and _in(o, market)})
    markets = sorted({o.instance_type for o in with_room if o.profile == profile and o.instance_type
                      and o.instance_type != market})
    hints = [f"another GPU type ({', '.join(others)}: LYCEUM_HARDWARE_PROFILE)"] if others else []
    hints += [f"{profile} as {' or '.join(markets)} (LYCEUM_MARKET)"] if markets else []
    return f"try {' or '.join(hints)}, or later" if hints else "try later"


def shortfall(found: list[Offer], profile: str, gpu_count: int, market: str = ON_DEMAND) -> str | None:
    """None when some offer in `market` covers `profile` with `gpu_count` GPUs per VM; else the one-line
    refusal naming what is available."""
    mine = [o for o in found if o.profile == profile and _in(o, market)]
    if any(o.covers(gpu_count) for o in mine):
        return None
    pools = sorted({o.instance_type for o in found if o.profile == profile and o.instance_type})
    if not mine and pools:  # the profile is offered, never in this pool
        return (f"Lyceum has no {market} variant of {profile} (only {', '.join(pools)}); "
                f"set LYCEUM_MARKET={pools[0]} or pick another LYCEUM_HARDWARE_PROFILE")
    with_room = [o.describe() for o in found if _room(o)]
    return (f"Lyceum has no capacity for {_want(profile, gpu_count, market)} right now (available: "
            f"{', '.join(with_room) or 'nothing'}); {_alternatives(found, profile, market)}")


def refused(found: list[Offer], profile: str, gpu_count: int, answer: str, market: str = ON_DEMAND) -> str:
    """The one line for a create Lyceum refused for want of capacity (live: HTTP 500 "could not be
    provisioned", nothing created), with what else is on offer."""
    return (f"no capacity: Lyceum could not provision {_want(profile, gpu_count, market)} ({answer}); "
            f"{_alternatives(found, profile, market)}")

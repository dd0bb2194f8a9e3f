"""Lyceum's hardware profiles and instance specs: the extra, validated inputs of a gpukit_vm.

Kept free of I/O so the Terraform provider can validate a plan without calling the API.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from glue.cloud.base import VMSpec
from glue.errors import GlueError

# hardware_profile -> GPU model reported in the outputs contract ("none" for the CPU profile). The GPU
# profiles are those a live 400 lists (2026); the docs' cpu profile is kept.
PROFILES: dict[str, str] = {"cpu": "none", "a100": "a100", "b200": "b200", "b300": "b300", "h100": "h100",
                            "h200": "h200", "l40s": "l40s"}
GPU_PROFILES = frozenset(p for p, gpu in PROFILES.items() if gpu != "none")
MIN_DISK_GB = 100  # Lyceum provisions at least 100 GB of (ephemeral) disk per VM
# GPUs per VM the live API takes (inside instance_specs; a 0 there is silently made 1, and billed).
GPU_COUNTS = (1, 2, 4, 8)
MAX_GPUS = max(GPU_COUNTS)
LIMITS: dict[str, tuple[int, int]] = {"cpu": (1, 256), "memory_gb": (1, 4096)}
# Lyceum's two capacity and price pools (the create's `instance_type`). Always sent explicitly: the server's
# default decides both what the VM costs and whether it can be reclaimed, and it is not ours.
ON_DEMAND, SPOT = "on-demand", "spot"
MARKETS = (ON_DEMAND, SPOT)


@dataclass(frozen=True)
class LyceumVMSpec(VMSpec):
    """A VMSpec plus Lyceum's instance specs; 0 / "" mean "the profile's default" (ssh_user "":
    detect the user the VM accepts)."""

    hardware_profile: str = ""
    cpu: int = 0
    memory_gb: int = 0
    ssh_user: str = ""
    market: str = ""  # "" : on-demand


def with_instance_specs(spec: VMSpec, hardware_profile: Any = None, cpu: Any = None,
                        memory_gb: Any = None, ssh_user: Any = None, market: Any = None) -> VMSpec:
    """`spec` unchanged when no Lyceum input is set (the local backend sees exactly what it did)."""
    user = ssh_user if isinstance(ssh_user, str) else ""  # unset or not yet known: detect it
    pool = market if isinstance(market, str) else ""
    if not hardware_profile and not cpu and not memory_gb and not user and not pool:
        return spec
    return LyceumVMSpec(**asdict(spec), hardware_profile=str(hardware_profile or ""),
                        cpu=int(cpu or 0), memory_gb=int(memory_gb or 0), ssh_user=user, market=pool)


def market_of(spec: VMSpec) -> str:
    """The pool a spec asks for: spot only when it says so."""
    return str(getattr(spec, "market", "") or ON_DEMAND)


def profile_of(spec: VMSpec) -> str:
    """The hardware profile a spec asks for: explicit, else derived from gpu_type."""
    explicit = getattr(spec, "hardware_profile", "")
    if explicit:
        return str(explicit).lower()
    gpu = spec.gpu_type.lower()
    return "cpu" if gpu in ("none", "cpu", "") else gpu


def input_errors(hardware_profile: Any, gpu_count: Any, disk_gb: Any = None, cpu: Any = None,
                 memory_gb: Any = None, for_lyceum: bool = False, market: Any = None) -> list[tuple[str, str, str]]:
    """(attribute, problem, fix) for every invalid input; values not yet known are skipped."""
    errors: list[tuple[str, str, str]] = []
    if isinstance(market, str) and market and market not in MARKETS:
        errors.append(("market", f"unknown market {market!r}", f"Use {ON_DEMAND} or {SPOT}."))
    if isinstance(hardware_profile, str) and hardware_profile:
        if hardware_profile.lower() not in PROFILES:
            errors.append(("hardware_profile", f"unknown hardware profile {hardware_profile!r}",
                           f"Use one of: {', '.join(PROFILES)}."))
        elif isinstance(gpu_count, int | float):
            if hardware_profile.lower() == "cpu" and gpu_count:
                errors.append(("gpu_count", f"gpu_count = {gpu_count:g} on the cpu profile",
                               "The cpu profile has no GPUs: set gpu_count = 0, or pick a GPU profile."))
            if hardware_profile.lower() in GPU_PROFILES and gpu_count not in GPU_COUNTS:
                errors.append(("gpu_count", f"gpu_count = {gpu_count:g} on the {hardware_profile} profile",
                               f"Use {', '.join(map(str, GPU_COUNTS[:-1]))} or {GPU_COUNTS[-1]} GPUs per VM."))
    for key, value in (("cpu", cpu), ("memory_gb", memory_gb)):
        lo, hi = LIMITS[key]
        if isinstance(value, int | float) and not lo <= value <= hi:
            errors.append((key, f"{key} = {value:g} is out of range", f"Use {lo}..{hi}, or leave it unset."))
    if for_lyceum and isinstance(disk_gb, int | float) and disk_gb < MIN_DISK_GB:
        errors.append(("disk_gb", f"disk_gb = {disk_gb:g} is below Lyceum's minimum",
                       f"Lyceum VMs have at least {MIN_DISK_GB} GB of disk."))
    return errors


def check(spec: VMSpec) -> str:
    """Validate a spec for Lyceum; return its hardware profile. Raises one-line GlueErrors."""
    profile = profile_of(spec)
    problems = input_errors(profile, spec.gpu_count, spec.disk_gb, getattr(spec, "cpu", 0) or None,
                            getattr(spec, "memory_gb", 0) or None, for_lyceum=True,
                            market=getattr(spec, "market", "") or None)
    if problems:
        _, what, fix = problems[0]
        raise GlueError(f"{what}: {fix}")
    return profile


# The create request's `instance_specs`, in the two shapes Lyceum's clients have sent. "current" is
# the documented one; "legacy" is what an older Lyceum CLI sent (LYCEUM_INSTANCE_SPECS=legacy).
SPECS_SHAPES = ("current", "legacy")


def instance_specs(spec: VMSpec, profile: str, shape: str = "current") -> dict[str, Any]:
    """`instance_specs` for a create: current {cpu, memory, disk, gpu_count}; legacy {vcpu: {min},
    memory: {min}, disk: {min}, gpu_type, gpu_count}. Unset cpu/memory are left out (the profile's)."""
    cpu, memory = getattr(spec, "cpu", 0), getattr(spec, "memory_gb", 0)
    if shape == "legacy":
        body: dict[str, Any] = {"disk": {"min": spec.disk_gb}, "gpu_count": spec.gpu_count}
        body.update({k: {"min": v} for k, v in (("vcpu", cpu), ("memory", memory)) if v})
        if profile in GPU_PROFILES:
            body["gpu_type"] = PROFILES[profile]
        return body
    if shape != "current":
        raise GlueError(f"LYCEUM_INSTANCE_SPECS={shape!r}: use one of {', '.join(SPECS_SHAPES)}")
    body = {"disk": spec.disk_gb, "gpu_count": spec.gpu_count}
    body.update({k: v for k, v in (("cpu", cpu), ("memory", memory)) if v})
    return body

"""Measurements taken INSIDE a trial process: its own peak RSS, CUDA allocator peaks, and the
attribution of one whole step's memory to weights, gradients, optimizer state and activations
from the PyTorch profiler's memory records (see docs/memprobe.md, "Phase breakdown").
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

MB = 2**20

# Profiler tensor categories -> the four parts of a step's memory (+ what is neither).
GROUPS = {
    "PARAMETER": "weights",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activations",
    "TEMPORARY": "activations",
    "AUTOGRAD_DETAIL": "activations",
    "INPUT": "inputs",
    "UNKNOWN": "other",
}
PART_NAMES = ("weights", "gradients", "optimizer_state", "activations", "inputs", "other")

_OOM_PATTERNS = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "defaultcpuallocator",
    "std::bad_alloc",
    "failed to allocate",
)


def is_oom_message(text: str) -> bool:
    low = text.lower()
    return any(p in low for p in _OOM_PATTERNS)


def tried_to_allocate_mb(text: str) -> float | None:
    """'Tried to allocate 2.50 GiB' (CUDA) / 'you tried to allocate 123456 bytes' (CPU), in MiB."""
    m = re.search(r"tried to allocate ([0-9.]+) ?(bytes|[KMGT]i?B)", text, re.IGNORECASE)
    if not m:
        return None
    unit = m.group(2).lower()
    scale = 1 if unit == "bytes" else 2 ** (10 * ("kmgt".index(unit[0]) + 1))
    return round(float(m.group(1)) * scale / MB, 1)


def proc_status_mb() -> dict[str, float]:
    """VmRSS / VmHWM (peak RSS) / VmSize / VmPeak of this process, in MiB."""
    out: dict[str, float] = {}
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "VmSize", "VmPeak"):
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def tensor_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(tensor_bytes(state.values()) for state in opt.state.values())


class CudaPhases:
    """Peak allocated memory per phase of a step on CUDA (reset_peak_memory_stats at each phase)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.enabled = device.type == "cuda"
        self.current: str | None = None
        self.peaks: dict[str, float] = {}

    def enter(self, phase: str | None) -> None:
        if not self.enabled:
            self.current = phase
            return
        if self.current is not None:
            peak = torch.cuda.max_memory_allocated(self.device) / MB
            self.peaks[self.current] = round(max(self.peaks.get(self.current, 0.0), peak), 1)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.current = phase


def cuda_figures(device: torch.device) -> dict[str, Any]:
    free, total = torch.cuda.mem_get_info(device)
    return {
        "max_allocated_mb": round(torch.cuda.max_memory_allocated(device) / MB, 1),
        "max_reserved_mb": round(torch.cuda.max_memory_reserved(device) / MB, 1),
        "total_mb": round(total / MB, 1),
        "free_mb": round(free / MB, 1),
        "name": torch.cuda.get_device_name(device),
    }


def _phase_ranges(prof: Any) -> list[tuple[str, int, int]]:
    ranges = []
    for ev in prof.profiler.kineto_results.events():
        name = ev.name()
        if name.startswith("memprobe::"):
            start = int(ev.start_ns())
            ranges.append((name.split("::", 1)[1], start, start + int(ev.duration_ns())))
    return sorted(ranges, key=lambda r: r[1])


def profile_breakdown(prof: Any, device: torch.device, top: int = 8) -> dict[str, Any]:
    """Walk the profiler's memory timeline for `device` (every tensor's create/destroy with its
    category) and return the live bytes by part at the step's peak, each part's own maximum, the
    peak within each phase, and the ops that allocated most (with their input shapes)."""
    from torch.profiler import _memory_profiler as mp

    mem = mp.MemoryProfile(prof.profiler.kineto_results)
    categories = mem._categories
    phases = _phase_ranges(prof)
    live: Counter[str] = Counter()
    part_max: Counter[str] = Counter()
    phase_peak: dict[str, int] = {}
    peak_total, peak_parts, peak_phase = 0, dict.fromkeys(PART_NAMES, 0), None
    dev = torch.device(device.type, device.index if device.index is not None else 0) if device.type == "cuda" \
        else torch.device("cpu")

    def part_of(key: Any, version: int) -> str:
        cat = categories.get(key, version) if isinstance(key, mp.TensorKey) else None
        return GROUPS.get(cat.name if cat is not None else "UNKNOWN", "other")

    def phase_of(t: int) -> str:
        for name, start, end in phases:
            if start <= t <= end:
                return name
        return "outside" if t >= 0 else "before"

    for t, action, (key, version), nbytes in mem.timeline:
        if key.device != dev:
            continue
        if action in (mp.Action.PREEXISTING, mp.Action.CREATE):
            live[part_of(key, version)] += nbytes
        elif action == mp.Action.INCREMENT_VERSION:
            live[part_of(key, version)] -= nbytes
            live[part_of(key, version + 1)] += nbytes
        elif action == mp.Action.DESTROY:
            live[part_of(key, version)] -= nbytes
        total = sum(live.values())
        for part, value in live.items():
            part_max[part] = max(part_max[part], value)
        ph = phase_of(t)
        phase_peak[ph] = max(phase_peak.get(ph, 0), total)
        if total > peak_total:
            peak_total, peak_parts, peak_phase = total, {p: live.get(p, 0) for p in PART_NAMES}, ph
    return {
        "method": "torch.profiler memory timeline (profile_memory, record_shapes, with_stack): tensor categories",
        "peak_mb": round(peak_total / MB, 2),
        "peak_phase": peak_phase,
        "at_peak_mb": {p: round(v / MB, 2) for p, v in peak_parts.items()},
        "part_max_mb": {p: round(part_max.get(p, 0) / MB, 2) for p in PART_NAMES},
        "phase_peak_mb": {p: round(v / MB, 2) for p, v in phase_peak.items() if p in ("forward", "backward",
                                                                                         "optimizer")},
        "top_ops": top_ops(prof, device, top),
    }


def direct_breakdown(direct: dict[str, float], resident: dict[str, float], weights: int,
                     why: BaseException) -> dict[str, Any]:
    """Without the profiler's timeline: weights, gradients and optimizer state counted from the
    tensors themselves; activations = the step's allocator peak minus everything else (CUDA only)."""
    w = weights / MB
    g, o = resident.get("gradients_mb"), resident.get("optimizer_state_mb")
    acts = None
    if "peak_mb" in direct:
        # before the step: weights, optimizer state and the previous step's gradients (freed by
        # zero_grad, then made again in backward): what the step adds on top is its activations
        acts = max(0.0, direct["peak_mb"] - direct["before_mb"])
    parts = {"weights": round(w, 2), "gradients": g, "optimizer_state": o,
             "activations": None if acts is None else round(acts, 2), "inputs": None, "other": None}
    return {
        "method": f"direct (profiler memory timeline unavailable: {type(why).__name__}: {str(why)[:120]})",
        "peak_mb": round(direct["peak_mb"], 2) if "peak_mb" in direct else None, "peak_phase": None,
        "at_peak_mb": parts, "part_max_mb": parts, "phase_peak_mb": {}, "top_ops": [],
    }


def top_ops(prof: Any, device: torch.device, n: int) -> list[dict[str, Any]]:
    """The ops that allocated the most memory themselves, grouped by input shapes."""
    attr = "self_device_memory_usage" if device.type == "cuda" else "self_cpu_memory_usage"
    rows = []
    for avg in prof.key_averages(group_by_input_shape=True):
        size = int(getattr(avg, attr, 0) or 0)
        if size > 0:
            rows.append({"op": avg.key, "input_shapes": str(avg.input_shapes), "calls": int(avg.count),
                         "allocated_mb": round(size / MB, 2)})
    rows.sort(key=lambda r: -r["allocated_mb"])
    return rows[:n]


def snapshot_summary(snap: dict[str, Any]) -> dict[str, Any]:
    """Totals from torch.cuda.memory._snapshot(): reserved segments, allocated bytes, fragmentation."""
    segments = snap.get("segments", [])
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated = sum(int(s.get("allocated_size", 0)) for s in segments)
    largest_free = 0
    for seg in segments:
        for block in seg.get("blocks", []):
            if block.get("state") == "inactive":
                largest_free = max(largest_free, int(block.get("size", 0)))
    return {"segments": len(segments), "reserved_mb": round(reserved / MB, 1),
            "allocated_mb": round(allocated / MB, 1), "largest_free_block_mb": round(largest_free / MB, 1),
            "trace_entries": sum(len(t) for t in snap.get("device_traces", []) or [])}

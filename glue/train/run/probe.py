"""A `glue memprobe` trial inside the user's own trainer: the RunContext runs in probe mode when
GPUKIT_PROBE_DIR is set (glue.train.trainer_vars).

In a probe nothing reaches the run's bucket records (the RunContext keeps them in the probe folder), the
checkpointer never saves, and the trainer stops itself cleanly after GPUKIT_PROBE_STEPS whole steps (at
`ctx.step`, or through the HF / Lightning callbacks). Meanwhile the model and optimizer the trainer
registered with the checkpointer are watched: forward pre/post hooks and the optimizer's step pre/post
hooks cut every step into phases (forward, backward, optimizer, other); each phase's peak is measured
(CPU: the process's peak RSS, reset at every phase start through /proc/self/clear_refs; CUDA:
torch.cuda.max_memory_allocated, reset likewise) and the parts resident at the end of the phase are
counted from the registered tensors' storages: weights, gradients, optimizer state, and activations (the
tensors autograd saved for backward in the forward). `other` is the peak minus those parts, shown, never
dropped, so the parts always add up to the peak.

Everything goes to <probe dir>/result.json (rewritten at every step; the phase also to result.json.phase,
so a trial the kernel OOM-kills still says where it was), the shape glue.memprobe.runner reads.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from glue.train import trainer_vars as V

MB = 2**20
RESULT = "result.json"
SNAPSHOT = "snapshot.pickle"
PHASES = ("forward", "backward", "optimizer", "other")
OOM_PATTERNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "defaultcpuallocator",
                "std::bad_alloc", "failed to allocate")


def is_oom_message(text: str) -> bool:
    low = text.lower()
    return any(p in low for p in OOM_PATTERNS)


def _status_mb() -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _storages_bytes(tensors: Iterable[Any], skip: set[int] | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (a view and its base count once)."""
    seen: set[int] = set(skip or ())
    total = 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += st.nbytes()
    return total


class _Meter:
    """A phase's peak: CUDA max allocated, or peak RSS reset at the phase start (clear_refs 5)."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.resettable = True

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            return
        if self.resettable:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.resettable = False  # the high-water mark then spans every phase so far

    def peak_mb(self) -> float:
        if self.cuda:
            import torch

            return float(torch.cuda.max_memory_allocated()) / MB
        return _status_mb().get("VmHWM", 0.0)


class Probe:
    """One trial's records and stop rule (see the module doc)."""

    def __init__(self, folder: Path, steps: int, mode: str = "trial") -> None:
        self.folder, self.steps, self.mode = folder, steps, mode
        self.result_path = folder / RESULT
        self.folder.mkdir(parents=True, exist_ok=True)
        self.res: dict[str, Any] = {"status": "running", "phase": "startup", "mode": mode, "probe": "run-context",
                                    "rss_base_mb": _status_mb().get("VmRSS")}
        self.losses: list[float] = []
        self.models: list[Any] = []
        self.optimizers: list[Any] = []
        self._meter: _Meter | None = None
        self._phase: str | None = None
        self._weights_ptrs: set[int] = set()
        self._saved: dict[int, int] = {}  # storage ptr -> bytes saved for backward in the current forward
        self._activations = 0
        self._runtime: float | None = None  # MB (CPU): Python, torch's libraries and caches
        self._saving: Any = None
        self._peaks: dict[str, float] = {}
        self._overall = 0.0  # MB: the highest phase peak of any step
        self._parts: dict[str, dict[str, float]] = {}
        self._t0 = time.monotonic()
        self._first_step_at: float | None = None
        self._recording = False
        self._hook = sys.excepthook
        sys.excepthook = self._excepthook
        self._write()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Probe | None:
        folder = env.get(V.PROBE_DIR)
        if not folder:
            return None
        steps = env.get(V.PROBE_STEPS) or "2"
        if not steps.isdigit() or int(steps) < 1:
            raise ValueError(f"{V.PROBE_STEPS}={steps!r} is not a whole number of steps (1 or more)")
        return cls(Path(folder), int(steps), env.get(V.PROBE_MODE) or "trial")

    # -- what is watched ---------------------------------------------------------------------------
    def watch(self, *objs: Any) -> None:
        """A model (nn.Module) or optimizer the trainer uses: hooked once; anything else is ignored."""
        import torch

        for obj in objs:
            inner = getattr(obj, "optimizer", None)  # accelerate / Lightning wrap the torch optimizer
            if isinstance(inner, torch.optim.Optimizer):
                obj = inner
            if isinstance(obj, torch.nn.Module) and not any(obj is m for m in self.models):
                self.models.append(obj)
                obj.register_forward_pre_hook(lambda m, a: self._forward_begin())
                obj.register_forward_hook(lambda m, a, o: self._forward_end())
            elif isinstance(obj, torch.optim.Optimizer) and not any(obj is o for o in self.optimizers):
                self.optimizers.append(obj)
                obj.register_step_pre_hook(lambda o, a, k: self._enter("optimizer"))
                obj.register_step_post_hook(lambda o, a, k: self._enter("other"))

    def _forward_begin(self) -> None:
        if self._saving is not None:  # a nested call of a watched module: already counting
            return
        import torch

        self._enter("forward")
        if not self._meter or not self._meter.cuda:  # resident outside the model's tensors between steps
            fixed = self._resident("other")
            rss = _status_mb().get("VmRSS", 0.0)
            self._runtime = max(0.0, rss - fixed["weights"] - fixed["gradients"] - fixed["optimizer_state"])
        self._saved = {}
        self._weights_ptrs = {p.untyped_storage().data_ptr() for m in self.models
                              for p in [*m.parameters(), *m.buffers()]}
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saving.__enter__()

    def _pack(self, t: Any) -> Any:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._weights_ptrs:
            self._saved[ptr] = st.nbytes()
        return t

    def _forward_end(self) -> None:
        if self._saving is not None:
            self._saving.__exit__(None, None, None)
            self._saving = None
        self._activations = sum(self._saved.values())
        self._enter("backward")

    # -- phases ------------------------------------------------------------------------------------
    def _resident(self, phase: str) -> dict[str, float]:
        """The parts resident as `phase` ends, in MB."""
        weights = _storages_bytes(t for m in self.models for t in [*m.parameters(), *m.buffers()])
        grads = _storages_bytes(p.grad for m in self.models for p in m.parameters())
        state = _storages_bytes(v for o in self.optimizers for s in o.state.values() for v in s.values()
                                if hasattr(v, "untyped_storage"))
        acts = self._activations if phase in ("forward", "backward") else 0
        out = {"weights": weights / MB, "gradients": grads / MB, "optimizer_state": state / MB,
               "activations": acts / MB}
        if self._runtime is not None:
            out["runtime"] = self._runtime
        return out

    def _enter(self, phase: str) -> None:
        if self._meter is None:
            self._meter = _Meter()
        if self._phase is not None and self._phase != phase:
            peak = self._meter.peak_mb()
            self._overall = max(self._overall, peak)
            # the parts from the last step only: the steady state, optimizer state and all (the first step has none)
            steady = len(self.losses) >= self.steps - 1
            if steady and peak >= self._peaks.get(self._phase, -1.0):
                self._peaks[self._phase] = peak
                self._parts[self._phase] = self._resident(self._phase)
        if phase != self._phase:
            self._phase = phase
            self._meter.reset()
            self._mark(phase)

    def _mark(self, phase: str) -> None:
        self.res["phase"] = phase
        try:
            self.result_path.with_name(RESULT + ".phase").write_text(phase)
        except OSError:
            pass

    # -- steps and the end -------------------------------------------------------------------------
    def on_step(self, loss: float) -> bool:
        """A whole step done; True once the trial has run its steps (the trainer stops here)."""
        if self._first_step_at is None:
            self._first_step_at = time.monotonic()
        self.losses.append(float(loss))
        done = len(self.losses) >= self.steps
        if self.mode == "breakdown" and len(self.losses) == self.steps - 1:
            self._recording = _record_history(True)  # the last step's allocations, on CUDA
        if done:
            self.finish()
        else:
            self._write()
        return done

    def stop_due(self, steps_done: int | None = None) -> bool:
        return (len(self.losses) if steps_done is None else steps_done) >= self.steps

    def finish(self) -> None:
        if self.res["status"] == "running":
            self.res["status"] = "ok"
        if self._phase is not None:
            self._enter("end")
        if self._recording:
            self._dump_snapshot()
        self._write()

    def fail(self, exc: BaseException) -> None:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else "(no message)"
        oom = isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or is_oom_message(text)
        self.res["status"] = "oom" if oom else "error"
        self.res["error"] = f"{type(exc).__name__}: {first}"[:400]
        self._write()

    def _excepthook(self, typ: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if self.res["status"] == "running":
            self.fail(exc)
        self._hook(typ, exc, tb)

    def _dump_snapshot(self) -> None:
        import pickle

        import torch

        try:
            snap = torch.cuda.memory._snapshot()
            (self.folder / SNAPSHOT).write_bytes(pickle.dumps(snap))
            self.res["cuda_snapshot"] = SNAPSHOT
        finally:
            _record_history(False)

    def _write(self) -> None:
        res = self.res
        res.update(self._figures())
        tmp = self.result_path.with_name(RESULT + ".tmp")
        try:
            tmp.write_text(json.dumps(res, indent=1))
            os.replace(tmp, self.result_path)
        except OSError:
            pass

    def _figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps_run": len(self.losses), "wall_s": round(time.monotonic() - self._t0, 3)}
        if self.losses:
            out.update(loss_first=self.losses[0], loss_last=self.losses[-1])
        if self._first_step_at is not None and len(self.losses) > 1:
            out["step_s"] = round((time.monotonic() - self._first_step_at) / (len(self.losses) - 1), 4)
        st = _status_mb()
        cuda_meter = bool(self._meter and self._meter.cuda)
        out["peak_rss_mb"] = max(st.get("VmHWM", 0.0), 0.0 if cuda_meter else self._overall)
        if self.models:
            out["model"] = self._model_facts()
        if self._peaks:
            out["breakdown"] = breakdown(self._peaks, self._parts, cuda=bool(self._meter and self._meter.cuda))
        cuda = _cuda_figures()
        if cuda is not None:  # the per-phase resets hide the step's peak from the allocator: the phases keep it
            cuda["max_allocated_mb"] = round(max(cuda["max_allocated_mb"], self._overall), 1)
            out["cuda"] = cuda
        return out

    def _model_facts(self) -> dict[str, Any]:
        params = [p for m in self.models for p in m.parameters()]
        trainable = [p for p in params if p.requires_grad]
        weights = _storages_bytes([*params, *(b for m in self.models for b in m.buffers())])
        state = _storages_bytes(v for o in self.optimizers for s in o.state.values() for v in s.values()
                                if hasattr(v, "untyped_storage"))
        return {"parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in trainable), "weights_mb": round(weights / MB, 3),
                "expected_gradients_mb": round(_storages_bytes(trainable) / MB, 3),
                "optimizer_state_mb": round(state / MB, 3)}


def breakdown(peaks: dict[str, float], parts: dict[str, dict[str, float]], *, cuda: bool) -> dict[str, Any]:
    """The step's peak phase and the parts resident then; `other` = the peak minus them (may be negative
    when the counted parts were not all alive at the very moment of the peak: said, not hidden)."""
    phase = max((p for p in peaks if p in PHASES), key=lambda p: peaks[p], default=None)
    if phase is None:
        return {}
    peak = peaks[phase]
    at = {k: round(v, 3) for k, v in parts[phase].items()}
    at["other"] = round(peak - sum(at.values()), 3)
    return {
        "source": "cuda max_memory_allocated" if cuda else "process peak RSS (VmHWM, reset per phase)",
        "peak_mb": round(peak, 3), "peak_phase": phase,
        "phase_peak_mb": {p: round(v, 3) for p, v in peaks.items() if p in PHASES},
        "at_peak_mb": at,
        "other_is": "temporaries and inputs (tensors the model's parts do not hold)" if cuda else
                    "temporaries, inputs and allocator slack (runtime: the process's resident memory outside the "
                    "model's tensors between steps: Python, torch's libraries)",
    }


def _cuda_figures() -> dict[str, Any] | None:
    if "torch" not in sys.modules:
        return None
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return {"max_allocated_mb": round(torch.cuda.max_memory_allocated() / MB, 1),
            "max_reserved_mb": round(torch.cuda.max_memory_reserved() / MB, 1),
            "total_mb": round(torch.cuda.get_device_properties(0).total_memory / MB, 1)}


def _record_history(on: bool) -> bool:
    if "torch" not in sys.modules:
        return False
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    record: Callable[..., Any] = torch.cuda.memory._record_memory_history
    try:
        if on:
            record(enabled="all", stacks="python", max_entries=100_000)
        else:
            record(enabled=None)
    except (AttributeError, RuntimeError, TypeError):
        return False
    return True

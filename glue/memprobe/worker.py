"""One memprobe trial, in its own fresh process:

    python -m glue.memprobe.worker SPEC.json RESULT.json

Builds tiny_gpt from the spec's trainer config and runs whole training steps (forward, backward,
gradient clipping, optimizer update, LR schedule) exactly as `glue.examples.tiny_gpt.train` does,
then writes what it measured to RESULT.json. An allocation failure (torch.OutOfMemoryError,
MemoryError, "DefaultCPUAllocator: can't allocate memory") is caught and reported as status "oom"
with the phase it happened in (exit 3); a kill by the kernel OOM killer leaves the partial result
written after the model was built, and the parent reads the kill from the cgroup.

Spec keys: mode ("trial" | "breakdown"), cfg (the full trainer config), device, steps,
gpu_limit_mb (cap the CUDA allocator at this many MB), snapshot (path for a CUDA memory
snapshot pickle, breakdown only).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_OOM = 3
EXIT_ERROR = 1

_T0 = time.monotonic()


class Trial:
    def __init__(self, spec: dict[str, Any], result_path: Path) -> None:
        self.spec = spec
        self.result_path = result_path
        self.result: dict[str, Any] = {"status": "running", "mode": spec.get("mode", "trial"), "phase": "import"}

    def write(self) -> None:
        self.result["wall_s"] = round(time.monotonic() - _T0, 3)
        tmp = self.result_path.with_name(self.result_path.name + ".tmp")
        tmp.write_text(json.dumps(self.result, indent=1))
        os.replace(tmp, self.result_path)

    def set_phase(self, phase: str) -> None:
        """Kept in a marker file too, so a trial the kernel kills still tells where it was."""
        if self.result.get("phase") != phase:
            self.result["phase"] = phase
            self.result_path.with_name(self.result_path.name + ".phase").write_text(phase)


def _batches(ids: Any, batch: int, seq_len: int, seed: int, device: Any) -> Callable[[], tuple[Any, Any]]:
    """Random windows of the corpus (wrapping around), the same sequence for every trial with the
    same seed and effective batch, whatever the sizes (a huge batch needs no huge corpus)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = len(ids) - 1
    span = torch.arange(seq_len)

    def draw() -> tuple[Any, Any]:
        idx = (torch.randint(0, n, (batch,), generator=gen)[:, None] + span) % n
        return ids[idx].to(device), ids[idx + 1].to(device)

    return draw


def _open_device(spec: dict[str, Any], res: dict[str, Any]) -> Any:
    """The trial's device; on CUDA the allocator capped at gpu_limit_mb and its peak statistics reset."""
    import torch

    from glue.memprobe import measure

    device = torch.device(spec.get("device", "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"CUDA is not available here (torch {torch.__version__}); use --device cpu")
        torch.cuda.init()
        if spec.get("gpu_limit_mb"):
            total = torch.cuda.get_device_properties(device).total_memory
            fraction = min(1.0, float(spec["gpu_limit_mb"]) * measure.MB / total)
            torch.cuda.set_per_process_memory_fraction(fraction, device)
            res["gpu_fraction"] = round(fraction, 4)
        torch.cuda.reset_peak_memory_stats(device)
    return device


class _Training:
    """tiny_gpt's model, optimizer and schedule as glue.examples.tiny_gpt.train builds them, and its
    whole training step, each phase named (for the OOM report) and measured."""

    def __init__(self, trial: Trial, cfg: dict[str, Any], device: Any) -> None:
        import torch

        from glue.examples.tiny_gpt import build
        from glue.memprobe import measure

        self.trial, self.device = trial, device
        self.phases = measure.CudaPhases(device)
        trial.set_phase("build")
        self.model, data, _ = build(cfg)
        self.model.to(device)
        if cfg.get("adapter_only"):
            for name, p in self.model.named_parameters():
                p.requires_grad = name.startswith("head.")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=float(cfg["lr"]), weight_decay=0.01)
        total_steps, warm = int(cfg["steps"]), int(cfg["warmup"])
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt,
            lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
        self.weights = measure.tensor_bytes(self.model.parameters()) + measure.tensor_bytes(self.model.buffers())
        batch, self.accum = int(cfg["batch_size"]), max(1, int(cfg.get("grad_accum") or 1))
        self.draw = _batches(data.ids, batch * self.accum, int(cfg["seq_len"]), int(cfg["seed"]), device)
        self.autocast = bool(cfg.get("autocast_bf16"))
        self.losses: list[float] = []
        self.resident: dict[str, float] = {}

    def model_facts(self) -> dict[str, Any]:
        from glue.memprobe import measure

        trainable = measure.tensor_bytes(self.params)
        return {
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "trainable_parameters": sum(p.numel() for p in self.params),
            "weights_mb": round(self.weights / measure.MB, 2),
            # fp32 gradients for every trainable weight; AdamW keeps exp_avg and exp_avg_sq for each.
            "expected_gradients_mb": round(trainable / measure.MB, 2),
            "expected_optimizer_state_mb": round(2 * trainable / measure.MB, 2),
        }

    def _enter(self, phase: str | None) -> None:
        if phase is not None:
            self.trial.set_phase(phase)
        self.phases.enter(phase)

    def step(self) -> None:
        import torch
        from torch import nn
        from torch.profiler import record_function

        from glue.memprobe import measure

        self.opt.zero_grad(set_to_none=True)
        x, y = self.draw()
        loss_value = 0.0
        for xm, ym in zip(x.chunk(self.accum), y.chunk(self.accum), strict=True):
            self._enter("forward")
            with record_function("memprobe::forward"), torch.autocast(self.device.type, dtype=torch.bfloat16,
                                                                       enabled=self.autocast):
                logits = self.model(xm)
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ym.reshape(-1))
            self._enter("backward")
            with record_function("memprobe::backward"):
                (loss / self.accum).backward()
            loss_value += loss.item() / self.accum
            del logits, loss
        self._enter("optimizer")
        with record_function("memprobe::optimizer"):
            self.resident["gradients_mb"] = round(measure.tensor_bytes(p.grad for p in self.params) / measure.MB, 2)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.sched.step()
        self._enter(None)
        self.resident["optimizer_state_mb"] = round(measure.optimizer_state_bytes(self.opt) / measure.MB, 2)
        self.losses.append(loss_value)


def _profiled_step(trial: Trial, training: _Training) -> None:
    """Breakdown mode: one step to create the optimizer state, then a profiled steady-state step; the
    whole step's memory by part, from the profiler's timeline or (its API is private) measured directly."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from glue.memprobe import measure

    spec, res, device = trial.spec, trial.result, training.device
    training.step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    snap_path = spec.get("snapshot") if device.type == "cuda" else None
    recording = bool(snap_path) and _record_history(True)
    direct: dict[str, float] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        direct["before_mb"] = torch.cuda.memory_allocated(device) / measure.MB
    with profile(activities=acts, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        training.step()
    if device.type == "cuda":
        direct["peak_mb"] = torch.cuda.max_memory_allocated(device) / measure.MB
    if recording:
        import pickle

        snap = torch.cuda.memory._snapshot()
        _record_history(False)
        Path(str(snap_path)).write_bytes(pickle.dumps(snap))
        res["cuda_snapshot"] = measure.snapshot_summary(snap)
    trial.set_phase("analysis")
    try:
        res["breakdown"] = measure.profile_breakdown(prof, device)
    except (AttributeError, AssertionError, IndexError, KeyError, RuntimeError, TypeError, ValueError) as exc:
        # The memory timeline is a private profiler API: fall back to what was measured directly.
        res["breakdown"] = measure.direct_breakdown(direct, training.resident, training.weights, exc)


def run(trial: Trial) -> None:
    """The trial as named steps: open the device, build, train (or profile one step), record."""
    import torch

    from glue.memprobe import measure  # torch: imported once the trial's phase says "import"

    spec, res = trial.spec, trial.result
    cfg: dict[str, Any] = dict(spec["cfg"])
    res["rss_base_mb"] = measure.proc_status_mb().get("VmRSS")
    device = _open_device(spec, res)
    torch.set_num_threads(int(cfg.get("threads") or 1))

    training = _Training(trial, cfg, device)
    res["model"] = training.model_facts()
    res["rss_after_build_mb"] = measure.proc_status_mb().get("VmRSS")
    trial.write()  # survives a later SIGKILL

    t0 = time.monotonic()
    if spec.get("mode", "trial") == "breakdown":
        _profiled_step(trial, training)
    else:
        for _ in range(int(spec.get("steps", 2))):
            training.step()
    losses = training.losses
    if training.phases.peaks:
        res["cuda_phase_peak_mb"] = dict(training.phases.peaks)
    res["step_s"] = round((time.monotonic() - t0) / max(1, len(losses)), 4)
    res["steps_run"] = len(losses)
    res["loss_first"], res["loss_last"] = losses[0], losses[-1]
    res["resident"] = training.resident | {"weights_mb": round(training.weights / measure.MB, 2)}


def _record_history(on: bool) -> bool:
    """CUDA memory history for the snapshot (torch.cuda.memory._record_memory_history), if it works here."""
    import torch

    try:
        if on:
            # python stacks only: C++ unwinding of every allocation would cost more than the step
            torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=100_000)
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
    except (AttributeError, RuntimeError, TypeError) as exc:
        print(f"memprobe trial: no CUDA memory history: {exc}", file=sys.stderr)
        return False
    return True


def finish_measurements(trial: Trial) -> None:
    from glue.memprobe import measure

    st = measure.proc_status_mb()
    trial.result["peak_rss_mb"] = st.get("VmHWM")
    trial.result["peak_vm_mb"] = st.get("VmPeak")
    device = str(trial.spec.get("device", "cpu"))
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            trial.result["cuda"] = measure.cuda_figures(torch.device(device))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    trial = Trial(spec, Path(argv[1]))
    code = 0
    try:
        import torch

        try:
            run(trial)
            trial.result["status"] = "ok"
        except torch.OutOfMemoryError as exc:
            code = _oom(trial, exc)
        except RuntimeError as exc:
            from glue.memprobe.measure import is_oom_message

            if not is_oom_message(str(exc)):
                raise
            code = _oom(trial, exc)
    except MemoryError as exc:
        code = _oom(trial, exc)
    except (RuntimeError, ValueError, TypeError, KeyError, OSError, ImportError) as exc:
        traceback.print_exc()
        trial.result["status"] = "error"
        trial.result["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        code = EXIT_ERROR
    finish_measurements(trial)
    trial.write()
    return code


def _oom(trial: Trial, exc: BaseException) -> int:
    from glue.memprobe.measure import tried_to_allocate_mb

    text = str(exc).strip()
    trial.result["status"] = "oom"
    trial.result["error"] = f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"[:400]
    trial.result["tried_to_allocate_mb"] = tried_to_allocate_mb(text)
    print(f"memprobe trial: out of memory in {trial.result.get('phase')}: {trial.result['error']}", file=sys.stderr)
    return EXIT_OOM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

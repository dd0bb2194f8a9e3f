"""GPU check helpers (bench/gpu_check.sh runs them on a CUDA machine; they run on the CPU too).

    python bench/gpu_check.py resume --device cuda --out DIR   # checkpoint/resume equivalence
    python bench/gpu_check.py stall  --device cuda --out DIR   # async-save stall vs synchronous torch.save
    python bench/gpu_check.py                                  # both, small, on cuda if there is one

resume: tiny_gpt trained N steps without a break (reference) vs M steps, an interruption, and a NEW
process that restores the checkpoint (glue.train.Checkpointer, local directory) and trains to N.
The per-step losses after M and the final weights must match (max abs difference <= --tol; bitwise
is reported separately).

stall: training-thread time of Checkpointer.save() (async: copy to host memory, then return) against
a synchronous torch.save of the same state to the same disk (+ fsync), and against the bare copy of
the state to host memory (the floor). Ratio = sync / async.

Every subcommand writes <name>.json and <name>.txt into --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Interrupt(Exception):
    """Raised from the step report to stop training right after step M's checkpoint was issued."""


class Recorder:
    def __init__(self, stop_after: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.stop_after = stop_after

    def step(self, step: int, loss: float, **_fingerprints: Any) -> None:
        if self.stop_after is not None and step > self.stop_after:
            raise Interrupt(step)
        self.losses[step] = loss


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# -- resume equivalence ------------------------------------------------------------------------


def resume_cfg(args: argparse.Namespace) -> dict[str, Any]:
    from glue.examples.tiny_gpt import DEFAULTS

    return {**DEFAULTS, "steps": args.steps, "checkpoint_interval": args.split, "device": args.device,
            "batch_size": args.batch_size, "seq_len": args.seq_len, "d_model": args.d_model,
            "n_layer": args.n_layer, "n_head": args.n_head, "threads": 1, "parallel": args.parallel}


def resume_phase(args: argparse.Namespace) -> None:
    """One phase in its own process: ref | first | second. Writes losses + final weights."""
    import torch

    from glue.examples.tiny_gpt import full_state, train
    from glue.train import Checkpointer

    cfg = resume_cfg(args)
    ck = Checkpointer(args.ckpt_dir, async_save=True)
    rec = Recorder(stop_after=args.split if args.phase == "first" else None)
    out: dict[str, Any] = {"phase": args.phase}
    try:
        result = train(cfg, ck, resume=args.phase == "second", report=rec)
        model = result["model"]  # sharded (fsdp): the whole state gathered; the comparison is of full weights
        state = full_state(model) if args.parallel == "fsdp" else model.state_dict()
        out["state"] = {k: v.detach().cpu() for k, v in state.items()}
    except Interrupt:
        out["interrupted_at"] = max(rec.losses)
    ck.close()  # waits for the in-flight save (step M) to commit
    out["losses"] = rec.losses
    out["resumed_from"] = ck.last_restore.step if getattr(ck, "last_restore", None) else None
    torch.save(out, args.result)


def resume(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "resume" if args.parallel == "ddp" else f"resume_{args.parallel}"
    work = Path(tempfile.mkdtemp(prefix="gpucheck-resume-"))
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONUNBUFFERED": "1"}
    common = ["--device", args.device, "--steps", str(args.steps), "--split", str(args.split),
              "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--d-model", str(args.d_model),
              "--n-layer", str(args.n_layer), "--n-head", str(args.n_head), "--parallel", args.parallel]
    t0 = time.monotonic()
    timings = {}
    try:
        for phase, ckdir in (("ref", "ref"), ("first", "run"), ("second", "run")):
            t = time.monotonic()
            proc = subprocess.run(
                [sys.executable, __file__, "resume-phase", "--phase", phase, "--ckpt-dir", str(work / ckdir),
                 "--result", str(work / f"{phase}.pt"), *common],
                env=env, capture_output=True, text=True, timeout=args.timeout, stdin=subprocess.DEVNULL)
            timings[phase] = round(time.monotonic() - t, 2)
            (out_dir / f"{name}-{phase}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                return _emit(out_dir, name, {"ok": False, "error": f"phase {phase} exited {proc.returncode}: "
                                                 f"{tail}", "device": args.device, "seconds": timings})
        ref = torch.load(work / "ref.pt", weights_only=False)
        first = torch.load(work / "first.pt", weights_only=False)
        second = torch.load(work / "second.pt", weights_only=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m, n = args.split, args.steps
    after = [s for s in range(m + 1, n + 1)]
    loss_diff = max(abs(ref["losses"][s] - second["losses"][s]) for s in after)
    before_diff = max(abs(ref["losses"][s] - first["losses"][s]) for s in range(1, m + 1))
    param_diff = max(float((ref["state"][k].double() - second["state"][k].double()).abs().max()) for k in ref["state"])
    bitwise = all(ref["losses"][s] == second["losses"][s] for s in after) and all(
        torch.equal(ref["state"][k], second["state"][k]) for k in ref["state"])
    record = {
        "ok": bool(sorted(second["losses"]) == after and loss_diff <= args.tol and param_diff <= args.tol
                   and second.get("resumed_from") == m),
        "device": args.device, "parallel": args.parallel, "steps": n, "interrupted_after": m,
        "resumed_from": second.get("resumed_from"),
        "first_resumed_step": min(second["losses"]) if second["losses"] else None,
        "max_abs_loss_diff_after_resume": loss_diff, "max_abs_loss_diff_before": before_diff,
        "max_abs_param_diff": param_diff, "bitwise": bitwise, "tolerance": args.tol,
        "loss_at_n": {"reference": ref["losses"][n], "resumed": second["losses"].get(n)},
        "seconds": timings | {"total": round(time.monotonic() - t0, 2)},
    }
    return _emit(out_dir, name, record)


# -- async-save stall --------------------------------------------------------------------------


def build_state(size_mb: int, device: str, fsdp: bool = False) -> tuple[Any, Any, int]:
    import torch

    width = 1024
    per_layer = 3 * 4 * (width * width + width)  # fp32 weights + two AdamW moments
    layers = max(1, -(-size_mb * 2**20 // per_layer))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    if fsdp:  # FSDP2 over a one-rank group: the state is DTensors and the checkpoint goes through DCP
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        mesh = init_device_mesh(torch.device(device).type, (1,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width, device=device)).sum().backward()
    opt.step()
    nbytes = sum(t.numel() * t.element_size() for t in _local(model, opt))
    return model, opt, nbytes


def _local(model: Any, opt: Any) -> list[Any]:
    """This rank's tensors of the model and optimizer state (a DTensor's local shard)."""
    tensors = list(model.state_dict().values()) + [v for s in opt.state.values() for v in s.values() if v.dim()]
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def _sync_save(model: Any, opt: Any, path: Path, fsdp: bool) -> None:
    """The synchronous baseline: torch.save (+ fsync) of the state, or, sharded, a blocking dcp.save into a
    folder (DCP's FileSystemWriter fsyncs its files)."""
    import torch

    if fsdp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        dcp.save({"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=str(path))
        shutil.rmtree(path)
        return
    with open(path, "wb") as fh:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    path.unlink()


def stall(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from glue.train import Checkpointer, OptimizerState

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    fsdp = args.parallel == "fsdp"
    work = Path(tempfile.mkdtemp(prefix="gpucheck-stall-", dir=args.scratch))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    try:
        model, opt, nbytes = build_state(args.size_mb, args.device, fsdp)
        ck = Checkpointer(work / "ckpt", async_save=True, keep_last=2)
        ck.register("model", model)
        ck.register("optimizer", OptimizerState(model, opt) if fsdp else opt)
        asyncs, syncs, copies = [], [], []
        for i in range(args.repeats):
            sync()
            t = time.perf_counter()
            ck.save(i + 1)
            asyncs.append(time.perf_counter() - t)  # what the training thread waited
            ck.flush()
            sync()
            t = time.perf_counter()
            _sync_save(model, opt, work / f"sync-{i}", fsdp)
            syncs.append(time.perf_counter() - t)
            sync()
            t = time.perf_counter()
            host = [v.detach().to("cpu", copy=True) for v in _local(model, opt)]
            sync()
            copies.append(time.perf_counter() - t)
            del host
        timings = dict(ck.last_save_timings)
        ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, s, c = statistics.median(asyncs), statistics.median(syncs), statistics.median(copies)
    record = {
        "device": args.device, "parallel": args.parallel, "state_mb": round(nbytes / 2**20, 1),
        "repeats": args.repeats, "sync_baseline": "dcp.save" if fsdp else "torch.save",
        "async_save_stall_s": round(a, 4), "sync_torch_save_s": round(s, 4), "bare_host_copy_s": round(c, 4),
        "sync_over_async": round(s / a, 1) if a > 0 else None, "async_over_bare_copy": round(a / c, 2) if c else None,
        "last_async_save_timings": timings,
    }
    return _emit(out_dir, "stall" if not fsdp else "stall_fsdp", record)


def _emit(out_dir: Path, name: str, record: dict[str, Any]) -> dict[str, Any]:
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
    lines = [f"{name}: {'OK' if record.get('ok', True) else 'FAILED'}"]
    lines += [f"  {k:34} {v}" for k, v in record.items() if not isinstance(v, dict)]
    lines += [f"  {k:34} {json.dumps(v, default=str)}" for k, v in record.items() if isinstance(v, dict)]
    text = "\n".join(lines)
    (out_dir / f"{name}.txt").write_text(text + "\n")
    print(text, flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("resume", help="checkpoint/resume equivalence with tiny_gpt")
    rp = sub.add_parser("resume-phase", help=argparse.SUPPRESS)
    for p in (r, rp):
        p.add_argument("--device", default=None)
        p.add_argument("--steps", type=int, default=12, help="N")
        p.add_argument("--split", type=int, default=6, help="M: interrupted after this step's checkpoint")
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--seq-len", type=int, default=64)
        p.add_argument("--d-model", type=int, default=64)
        p.add_argument("--n-layer", type=int, default=2)
        p.add_argument("--n-head", type=int, default=4)
        p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp",
                       help="fsdp: the model FSDP2-sharded (a one-rank group), saved through DCP")
    r.add_argument("--out", default="bench/out/gpu")
    r.add_argument("--tol", type=float, default=1e-5)
    r.add_argument("--timeout", type=float, default=240)
    rp.add_argument("--phase", choices=["ref", "first", "second"], required=True)
    rp.add_argument("--ckpt-dir", required=True)
    rp.add_argument("--result", required=True)
    s = sub.add_parser("stall", help="async-save training-thread stall vs synchronous torch.save")
    s.add_argument("--device", default=None)
    s.add_argument("--size-mb", type=int, default=64)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp",
                   help="fsdp: FSDP2-sharded state saved through DCP; the baseline is a blocking dcp.save")
    s.add_argument("--out", default="bench/out/gpu")
    s.add_argument("--scratch", default=None, help="directory for the checkpoint files (default: system temp)")
    args = ap.parse_args(argv)
    if getattr(args, "device", None) is None:
        args.device = default_device()
    if args.cmd == "resume-phase":
        resume_phase(args)
        return 0
    if args.cmd == "resume":
        if not 1 <= args.split < args.steps:
            ap.error("need 1 <= --split < --steps")
        return 0 if resume(args)["ok"] else 1
    if args.cmd == "stall":
        stall(args)
        return 0
    # no subcommand (`make bench`): both, small; the ratio is sync torch.save over the async stall
    out = os.environ.get("OUT") or "bench/out/gpu"
    ok = main(["resume", "--out", out, "--device", args.device or default_device()]) == 0
    main(["stall", "--out", out, "--device", args.device or default_device()])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

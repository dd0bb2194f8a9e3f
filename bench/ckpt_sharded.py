"""Sharded checkpoint figures (issue 34), every ratio against a baseline measured in the same run.

    .venv/bin/python bench/ckpt_sharded.py --size-mb 256

State: an MLP of Linear(2048, 2048) layers, FSDP2-sharded (`fully_shard` per layer) over 2 ranks on
CPU/gloo, plus its AdamW state through glue.train's OptimizerState (DTensors: the DCP path), at least
--size-mb in all (each rank holds half). Bucket: a fresh local `rclone serve s3` on 127.0.0.1; every
transfer uses glue.train's TransferConfig.

  stall        training-thread time of Checkpointer.save() (async) on rank 0, vs
               (a) a synchronous dcp.save of the same state to the same bucket: DCP's FileSystemWriter
                   into a local folder, then every file put with boto3, before training goes on
                   (goal: >= 20x lower)
               (b) a bare copy of this rank's shards into host memory (goal: <= 1.2x of it)
  restore      Checkpointer.restore() on every rank (download, sha256 of every object, load into the
               shards), vs raw boto3 GETs of the same objects, every rank at once (goal: >= 0.9x),
               and vs the same GETs plus a sha256 of the bytes (the floor of any verified read);
               --repeats rounds of the three in turn, each figure the median of its rounds
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from glue.cloud.local.bucket import LocalBucket
from glue.train import Checkpointer, OptimizerState, layout
from glue.train.storage.s3 import DEFAULT_TRANSFER

MB = 1e6
WORLD = 2


def _model(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    width = 2048
    per_layer = 3 * 4 * (width * width + width)  # fp32 params + two AdamW moments
    layers = max(2, -(-size_mb * 2**20 // per_layer))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt


RUN = layout.run_prefix("sharded")  # the checkpoint target's keys, runs/sharded/…


def _sync_key(step: int, name: str) -> str:
    """A file of the synchronous dcp.save baseline at `step`, beside the run (runs/sync-<step>/)."""
    return layout.run_prefix(f"sync-{step}") + name


def _local_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.to_local() for p in model.parameters()]  # type: ignore[attr-defined]
    out += [v.to_local() if hasattr(v, "to_local") else v for s in opt.state.values() for v in s.values()]
    return [t for t in out if isinstance(t, torch.Tensor)]


def _rank(rank: int, port: int, conn: dict[str, Any], size_mb: int, repeats: int, out: str) -> None:
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    model, opt = _model(size_mb)
    creds = conn["creds"]
    s3 = boto3.client("s3", endpoint_url=conn["endpoint"], aws_access_key_id=creds.access_key,
                      aws_secret_access_key=creds.secret_key, region_name="us-east-1")
    ck = Checkpointer(layout.run_uri(conn["bucket"], "sharded"), endpoint_url=conn["endpoint"],
                      credentials=lambda: creds, handle_sigterm=False)
    ck.register("model", model)
    ck.register("optimizer", OptimizerState(model, opt))
    ck.save(0, blocking=True)  # warm-up: host buffers allocated, connections open, DCP imported
    stalls, copies, syncs = [], [], []
    kept = [x.detach().clone() for x in _local_tensors(model, opt)]  # preallocated, as our host buffers are
    for step in range(1, repeats + 1):
        t = time.perf_counter()
        for dst, src in zip(kept, _local_tensors(model, opt), strict=True):
            dst.copy_(src.detach())
        copies.append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        ck.save(step)
        stalls.append(time.perf_counter() - t)
        ck.flush()
        dist.barrier()
        # (a) synchronous dcp.save of the same state, then its files put to the same bucket
        folder = Path(tempfile.mkdtemp(prefix=f"dcp-{rank}-"))
        t = time.perf_counter()
        state = {"model": model.state_dict(), "optimizer": OptimizerState(model, opt).state_dict()}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)))
        for f in sorted(folder.iterdir()):
            if f.name.startswith(f"__{rank}_") or (rank == 0 and f.name == ".metadata"):
                s3.upload_file(str(f), conn["bucket"], _sync_key(step, f.name), Config=DEFAULT_TRANSFER)
        syncs.append(time.perf_counter() - t)
        shutil.rmtree(folder)
        dist.barrier()
    sent = ck.last_save_timings.get("bytes", 0)
    ck.close()
    # restore: ours, then raw GETs of the same objects (every rank reads every object, as restore does),
    # then the same GETs with a sha256; --repeats rounds of the three, each figure the median of its rounds
    # (one round alone says more about the other work on a shared machine than about either)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=conn["bucket"],
                                                   Prefix=RUN + layout.step_prefix(repeats))["Contents"]]
    restores, raws, raw_shas = [], [], []
    read = raw = 0
    for _ in range(repeats):
        os.sync()  # the saves above leave GBs of dirty pages: written back now, not during whichever read is first
        dist.barrier()
        again = Checkpointer(layout.run_uri(conn["bucket"], "sharded"), endpoint_url=conn["endpoint"],
                             credentials=lambda: creds, handle_sigterm=False)
        again.register("model", model)
        again.register("optimizer", OptimizerState(model, opt))
        t = time.perf_counter()
        again.restore()
        restores.append(time.perf_counter() - t)
        read = again.last_restore.timings["bytes"] if again.last_restore else 0
        again.close()
        dist.barrier()
        t = time.perf_counter()
        raw = 0
        for key in keys:
            raw += len(s3.get_object(Bucket=conn["bucket"], Key=key)["Body"].read())
        raws.append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        for key in keys:  # the floor of any verified read: the same GETs plus a sha256 of the bytes
            hashlib.sha256(s3.get_object(Bucket=conn["bucket"], Key=key)["Body"].read()).hexdigest()
        raw_shas.append(time.perf_counter() - t)
    med = statistics.median
    restore_s, raw_s, raw_sha_s = med(restores), med(raws), med(raw_shas)
    torch.save({"stalls": stalls, "copies": copies, "syncs": syncs, "sent": sent, "restore_s": restore_s,
                "read": read, "raw_s": raw_s, "raw_sha_s": raw_sha_s, "raw": raw, "restores": restores,
                "raws": raws}, out)
    dist.barrier()
    os._exit(0)  # not torn down: ~ProcessGroupGloo at exit can deadlock (tests/integration/test_ckpt_ddp.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256, help="state size over both ranks (MiB, at least)")
    ap.add_argument("--repeats", type=int, default=3, help="saves, and restore rounds, measured")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-sharded-"))
    bucket = LocalBucket(home)
    info = bucket.ensure_running()
    conn = {"endpoint": info.endpoint, "bucket": info.name, "creds": bucket.credentials()}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    outs = [str(home / f"rank{r}.pt") for r in range(WORLD)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, conn, args.size_mb, args.repeats, outs[r]))
             for r in range(WORLD)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(1800)
        if [p.exitcode for p in procs] != [0] * WORLD:
            raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        r0 = torch.load(outs[0], weights_only=False)
        med = statistics.median
        stall, copy, sync = med(r0["stalls"]), med(r0["copies"]), med(r0["syncs"])
        print(f"state: {r0['sent'] / MB:.0f} MB written by rank 0 per save ({WORLD} ranks, FSDP2)")
        print(f"{'figure':<34}{'ours':>10}{'baseline':>12}{'ratio':>9}  goal")
        print(f"{'stall vs synchronous dcp.save':<34}{stall:>9.3f}s{sync:>11.3f}s{sync / stall:>8.1f}x  >= 20x lower")
        print(f"{'stall vs bare host copy':<34}{stall:>9.3f}s{copy:>11.3f}s{stall / copy:>8.2f}x  <= 1.2x")
        ours, raw = r0["read"] / r0["restore_s"] / MB, r0["raw"] / r0["raw_s"] / MB
        print(f"{'restore vs raw boto3 GETs':<34}{ours:>7.0f}MB/s{raw:>9.0f}MB/s{ours / raw:>8.2f}x  >= 0.9x")
        floor = r0["raw"] / r0["raw_sha_s"] / MB
        print(f"{'restore vs raw GETs + sha256':<34}{ours:>7.0f}MB/s{floor:>9.0f}MB/s{ours / floor:>8.2f}x  (floor)")
        rounds = ", ".join(f"{a:.2f}s/{b:.2f}s" for a, b in zip(r0["restores"], r0["raws"], strict=True))
        print(f"rank 0's rounds (restore/raw GETs of {r0['read'] / MB:.0f} MB): {rounds}")
    finally:
        bucket.stop()
        shutil.rmtree(home, ignore_errors=True)  # gigabytes per run: the bucket, the DCP folders


if __name__ == "__main__":
    main()

"""Checkpoint figures (issue 4), every ratio against a baseline measured in the same run.

    .venv/bin/python bench/ckpt.py --size-mb 512

State: an MLP plus AdamW state (params + exp_avg + exp_avg_sq) of at least --size-mb, on CPU.
Bucket: a fresh local `rclone serve s3` on 127.0.0.1. All transfers, ours and the raw baselines,
use the same boto3 TransferConfig (glue.train's DEFAULT_TRANSFER). The raw baselines use a plain
boto3 client; one extra row repeats the raw put with glue.train's client settings (no botocore
checksums: glue.train hashes and reads back every object itself), to show what that part is worth.

  stall/save     training-thread time of Checkpointer.save() (async), vs
                 (a) synchronous torch.save to the same bucket  (goal: >= 10x lower)
                 (b) a bare copy of the state into host memory   (goal: <= 1.5x of it)
  upload         our upload throughput vs a raw boto3 put of the same bytes with boto3's default settings
                 (client and TransferConfig(): 8 MiB parts, 10 in flight; goal >= 0.9x); also vs raw puts with
                 our TransferConfig, and with our client settings too (reported)
  restore        our download+verify throughput, and end-to-end restore (download, sha256, torch.load,
                 load_state_dict), vs raw boto3 multipart get of the same objects (goal >= 0.9x); both also
                 vs raw get + sha256 of the bytes, the floor for any verified read on a CPU-bound machine,
                 and end to end vs the tightest raw read we know: the same parallel ranged GETs read from
                 the socket straight into one preallocated buffer, as ours, but with no sha256 and no load
  FUSE           the same save through an `rclone mount` of the bucket (--vfs-cache-mode writes),
                 vs the direct S3 save (ratio reported; no goal)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import torch
from boto3.s3.transfer import TransferConfig

from glue.cloud.local.bucket import LocalBucket
from glue.paths import tool
from glue.train import Checkpointer, layout
from glue.train.storage.s3 import DEFAULT_TRANSFER
from glue.train.storage.s3_client import make_s3_client

MB = 1e6
# The raw baselines' objects, beside the bench's run under runs/ (glue.train.layout names the keys).
RAW, RAW_OURS, RAW_DEFAULT, SYNC = (layout.run_prefix(name) for name in ("raw", "raw-ours", "raw-default", "sync"))


def _transfer(spec: str) -> TransferConfig:
    """PART_MIB:CONCURRENCY -> glue.train's DEFAULT_TRANSFER with those two changed."""
    try:
        part, conc = (int(x) for x in spec.split(":"))
    except ValueError:
        raise SystemExit(f"--transfer {spec!r}: give PART_MIB:CONCURRENCY, e.g. 8:10") from None
    return TransferConfig(multipart_threshold=part * 2**20, multipart_chunksize=part * 2**20, max_concurrency=conc,
                          io_chunksize=DEFAULT_TRANSFER.io_chunksize, max_io_queue=DEFAULT_TRANSFER.max_io_queue,
                          use_threads=True)


def _bench_key(step: int, component: str) -> str:
    """A component's object in the bench run's checkpoint at `step` (its target: runs/bench)."""
    return layout.run_prefix("bench") + layout.step_prefix(step) + layout.checkpoint_object_key(component, None)


def build_state(size_mb: int, width: int = 2048) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    per_layer = 3 * 4 * (width * width + width)  # fp32 params + two AdamW moments
    layers = max(1, -(-size_mb * 2**20 // per_layer))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.dim())
    return model, opt, nbytes


def _tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [*model.state_dict().values(), *(v for st in opt.state.values() for v in st.values())]


def bare_copy(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    t = time.perf_counter()
    m = {k: v.detach().clone() for k, v in model.state_dict().items()}
    o = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}
    dt = time.perf_counter() - t
    del m, o
    return dt


def ranged_get(client: Any, bucket: str, key: str, size: int, cfg: Any, pool: ThreadPoolExecutor) -> bytearray:
    """Raw baseline: parallel ranged GETs read from the socket into one preallocated buffer (http.client's
    readinto under botocore's body, as glue.train does), with no hashing and no checks."""
    buf = bytearray(size)
    view = memoryview(buf)
    part = cfg.multipart_chunksize

    def one(a: int) -> None:
        b = min(size, a + part)
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}")["Body"]
        fp = body._raw_stream._fp
        pos = a
        while pos < b:
            n = fp.readinto(view[pos : min(b, pos + cfg.io_chunksize)])
            if not n:
                raise SystemExit(f"{key}: short read at {pos}")
            pos += n
        body._raw_stream.release_conn()
        body.close()

    list(pool.map(one, range(0, size, part)))
    return buf


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def mount_fuse(endpoint: str, access: str, secret: str, mnt: Path, cache: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_GKB_TYPE": "s3",
        "RCLONE_CONFIG_GKB_PROVIDER": "Other",
        "RCLONE_CONFIG_GKB_ENDPOINT": endpoint,
        "RCLONE_CONFIG_GKB_ACCESS_KEY_ID": access,
        "RCLONE_CONFIG_GKB_SECRET_ACCESS_KEY": secret,
        "RCLONE_CONFIG_GKB_REGION": "us-east-1",
    }
    cmd = [
        tool("rclone"), "mount", "gkb:gpukit", str(mnt), "--vfs-cache-mode", "writes",
        "--vfs-write-back", "0s", "--cache-dir", str(cache), "--log-level", "ERROR",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"rclone mount failed (exit {proc.poll()})")
        time.sleep(0.1)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512, help="checkpoint state size (MiB, at least)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-fuse", action="store_true", help="skip the rclone FUSE mount figure")
    ap.add_argument("--transfer", metavar="PART_MIB:CONCURRENCY", default=None,
                    help="our saves and restores with these settings instead of glue.train's DEFAULT_TRANSFER "
                         "(to choose them by measurement; the raw baselines keep theirs)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # a training process leaves the other core to the uploader / server

    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-ckpt-"))
    bucket = LocalBucket(home)
    info = bucket.ensure_running()
    creds = bucket.credentials()
    s3 = boto3.client(
        "s3", endpoint_url=info.endpoint, aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key, region_name="us-east-1",
    )  # fmt: skip
    s3_ours = make_s3_client(info.endpoint, credentials=lambda: creds)  # glue.train's client settings
    cfg = DEFAULT_TRANSFER if args.transfer is None else _transfer(args.transfer)
    fuse: subprocess.Popen[bytes] | None = None
    mnt = home / "mnt"
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        model, opt, nbytes = build_state(args.size_mb)
        print(f"state: {nbytes / MB:.0f} MB ({len(model)} x Linear(2048, 2048) + AdamW), "
              f"parts {cfg.multipart_chunksize // 2**20} MiB x {cfg.max_concurrency}, "
              f"io chunks {cfg.io_chunksize // 2**10} KiB")

        kw: dict[str, Any] = {"endpoint_url": info.endpoint, "credentials": lambda: creds, "handle_sigterm": False,
                              "transfer": cfg}
        ck = Checkpointer(layout.run_uri(info.name, "bench"), **kw)
        ck.register("model", model)
        ck.register("optimizer", opt)
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
        blob = buf.getvalue()
        del buf
        prealloc = [t.detach().clone() for t in _tensors(model, opt)]
        t = time.perf_counter()
        ck.save(0, blocking=True)  # warm-up: allocates the snapshot buffers, opens connections
        cold = ck.last_save_timings["snapshot_s"]
        # Interleaved, so load from anything else on the machine hits ours and the baselines alike.
        copies, copies_pre, stalls, commits, timings, raw_up, raw_up_ours, raw_up_default = ([] for _ in range(8))
        for step in range(1, args.repeats + 1):
            copies.append(bare_copy(model, opt))
            t = time.perf_counter()
            for dst, src in zip(prealloc, _tensors(model, opt), strict=True):
                dst.copy_(src.detach())
            copies_pre.append(time.perf_counter() - t)
            t = time.perf_counter()
            ck.save(step)
            stalls.append(time.perf_counter() - t)
            ck.flush()
            commits.append(time.perf_counter() - t)
            timings.append(dict(ck.last_save_timings))
            t = time.perf_counter()
            s3.upload_fileobj(io.BytesIO(blob), info.name, f"{RAW}state-{step}.pt", Config=cfg)
            raw_up.append(len(blob) / (time.perf_counter() - t))
            t = time.perf_counter()
            s3_ours.upload_fileobj(io.BytesIO(blob), info.name, f"{RAW_OURS}state-{step}.pt", Config=cfg)
            raw_up_ours.append(len(blob) / (time.perf_counter() - t))
            t = time.perf_counter()
            s3.upload_fileobj(io.BytesIO(blob), info.name, f"{RAW_DEFAULT}state-{step}.pt")  # boto3's own defaults
            raw_up_default.append(len(blob) / (time.perf_counter() - t))
        ck.close()
        del prealloc
        sent = timings[-1]["bytes"]

        # (a) synchronous torch.save to the same bucket
        syncs = []
        for i in range(max(2, args.repeats - 1)):
            t = time.perf_counter()
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
            s3.upload_fileobj(io.BytesIO(buf.getvalue()), info.name, f"{SYNC}state-{i}.pt", Config=cfg)
            syncs.append(time.perf_counter() - t)
            del buf
        del blob

        # restore: ours (into fresh objects, as a new process would) vs raw multipart get of the same objects
        step_keys = [_bench_key(args.repeats, c) for c in ("model", "optimizer")]
        restores: list[dict[str, Any]] = []
        raw_down, raw_down_sha, raw_ranged = [], [], []
        sizes = {k: int(s3.head_object(Bucket=info.name, Key=k)["ContentLength"]) for k in step_keys}
        ranged_pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency)
        for _ in range(args.repeats):
            m2, o2, _ = build_state(args.size_mb)
            r = Checkpointer(layout.run_uri(info.name, "bench"), **kw)
            r.register("model", m2)
            r.register("optimizer", o2)
            t = time.perf_counter()
            r.restore()
            assert r.last_restore is not None
            restores.append({**r.last_restore.timings, "wall_s": time.perf_counter() - t})
            r.close()
            assert torch.equal(next(iter(m2.state_dict().values())), next(iter(model.state_dict().values())))
            del m2, o2
            t = time.perf_counter()
            got = 0
            for key in step_keys:
                b = io.BytesIO()
                s3.download_fileobj(info.name, key, b, Config=cfg)
                got += b.getbuffer().nbytes
                del b
            raw_down.append(got / (time.perf_counter() - t))
            # the same plus the sha256 every restore must compute: the floor for a verified read
            t = time.perf_counter()
            for key in step_keys:
                b = io.BytesIO()
                s3.download_fileobj(info.name, key, b, Config=cfg)
                hashlib.sha256(b.getbuffer()).hexdigest()
                del b
            raw_down_sha.append(got / (time.perf_counter() - t))
            t = time.perf_counter()
            for key in step_keys:  # one object after the other, each in parallel parts
                del_me = ranged_get(s3_ours, info.name, key, sizes[key], cfg, ranged_pool)
                del del_me
            raw_ranged.append(got / (time.perf_counter() - t))
        ranged_pool.shutdown()

        # FUSE: the same save, through an rclone mount of the same bucket
        fuse_commit = fuse_visible = None
        if not args.no_fuse:
            mnt.mkdir()
            fuse = mount_fuse(info.endpoint, creds.access_key, creds.secret_key, mnt, home / "vfs-cache")
            fck = Checkpointer(str(mnt / layout.run_prefix("bench-fuse")), handle_sigterm=False)
            fck.register("model", model)
            fck.register("optimizer", opt)
            t = time.perf_counter()
            fck.save(1, blocking=True)
            fuse_commit = time.perf_counter() - t
            # Durable only once rclone has uploaded it: wait until COMMIT.json is in the bucket.
            key = layout.run_prefix("bench-fuse") + layout.commit_key(1)
            while True:
                try:
                    s3.head_object(Bucket=info.name, Key=key)
                    break
                except s3.exceptions.ClientError:
                    time.sleep(0.05)
            fuse_visible = time.perf_counter() - t
            fck.close()

        # The baseline is the faster of: clone into fresh memory, copy into preallocated buffers.
        stall, copy, sync = med(stalls), min(med(copies), med(copies_pre)), med(syncs)
        up_ours = med([x["bytes"] / x["upload_s"] for x in timings])
        up_raw = med(raw_up)
        dl_ours = med([x["bytes"] / x["download_s"] for x in restores])
        rs_ours = med([x["bytes"] / x["wall_s"] for x in restores])
        dl_raw = med(raw_down)
        s3_commit = med(commits)

        def row(name: str, ours: str, base: str, ratio: float, goal: str, ok: bool | None) -> None:
            verdict = "" if ok is None else ("ok" if ok else "MISSED")
            rows.append((name, ours, base, f"{ratio:.3g}x", f"{goal} {verdict}".strip()))

        row("stall/save vs sync torch.save->S3", f"{stall:.3f}s", f"{sync:.3f}s", sync / stall, ">=10x lower",
            sync / stall >= 10)
        row("stall/save vs bare host copy", f"{stall:.3f}s", f"{copy:.3f}s", stall / copy, "<=1.5x",
            stall / copy <= 1.5)
        up_raw_default = med(raw_up_default)
        row("upload vs raw put, boto3's defaults", f"{up_ours / MB:.0f}MB/s", f"{up_raw_default / MB:.0f}MB/s",
            up_ours / up_raw_default, ">=0.9x", up_ours / up_raw_default >= 0.9)
        row("upload vs raw put, our TransferConfig", f"{up_ours / MB:.0f}MB/s", f"{up_raw / MB:.0f}MB/s",
            up_ours / up_raw, "report", None)
        up_raw_ours = med(raw_up_ours)
        row("upload vs raw put, our client settings", f"{up_ours / MB:.0f}MB/s", f"{up_raw_ours / MB:.0f}MB/s",
            up_ours / up_raw_ours, "report", None)
        row("restore download+sha256 vs raw get", f"{dl_ours / MB:.0f}MB/s", f"{dl_raw / MB:.0f}MB/s",
            dl_ours / dl_raw, ">=0.9x", dl_ours / dl_raw >= 0.9)
        row("restore end-to-end (+load) vs raw get", f"{rs_ours / MB:.0f}MB/s", f"{dl_raw / MB:.0f}MB/s",
            rs_ours / dl_raw, ">=0.9x", rs_ours / dl_raw >= 0.9)
        dl_sha = med(raw_down_sha)
        row("restore download+sha256 vs raw get+sha256", f"{dl_ours / MB:.0f}MB/s", f"{dl_sha / MB:.0f}MB/s",
            dl_ours / dl_sha, "report", None)
        row("restore end-to-end vs raw get+sha256", f"{rs_ours / MB:.0f}MB/s", f"{dl_sha / MB:.0f}MB/s",
            rs_ours / dl_sha, "report", None)
        dl_ranged = med(raw_ranged)
        row("restore end-to-end vs raw ranged readinto get", f"{rs_ours / MB:.0f}MB/s", f"{dl_ranged / MB:.0f}MB/s",
            rs_ours / dl_ranged, "report", None)
        if fuse_commit is not None and fuse_visible is not None:
            row("FUSE save (commit returned) vs S3", f"{fuse_commit:.2f}s", f"{s3_commit:.2f}s",
                fuse_commit / s3_commit, "report", None)
            row("FUSE save (COMMIT in bucket) vs S3", f"{fuse_visible:.2f}s", f"{s3_commit:.2f}s",
                fuse_visible / s3_commit, "report", None)
        last = timings[-1]
        print(f"async save, background: serialize {last['serialize_s']:.2f}s, upload {last['upload_s']:.2f}s, "
              f"verify {last['verify_s']:.2f}s, all {last['background_s']:.2f}s + prune {last['prune_s']:.2f}s; "
              f"save() to committed {s3_commit:.2f}s (median); {sent / MB:.0f} MB sent")
        rr = restores[-1]
        print(f"restore: download+sha256 {rr['download_s']:.2f}s, load {rr['load_s']:.2f}s, wall {rr['wall_s']:.2f}s")
        print(f"stall per save (s): {', '.join(f'{x:.3f}' for x in stalls)}, first (cold) save {cold:.3f}; "
              f"bare copy: fresh {med(copies):.3f}s, preallocated {med(copies_pre):.3f}s")
        widths = [max(len(r[i]) for r in [*rows, ("figure", "ours", "baseline", "ratio", "goal")]) for i in range(5)]
        header = ("figure", "ours", "baseline", "ratio", "goal")
        for r in [header, *rows]:
            cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
            print("  ".join(cells))
    finally:
        if fuse is not None:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
            fuse.terminate()
            fuse.wait(10)
        bucket.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Workdir shipping and the bucket wheelhouse (issue 32), every figure against a baseline measured in the
same run and reported as a ratio (no timing is asserted; the script fails only when something does not
work: a package uploaded twice, a venv without its pins).

    .venv/bin/python bench/workdir.py [--files 1000] [--size-mb 50] [--rounds 5] [--json bench/out/workdir.json]

Bucket: a fresh local `rclone serve s3` on 127.0.0.1 in a throwaway home. Tree: --files files of random
(incompressible) bytes, --size-mb in all, in nested folders, with a .gitignore and a few small files it
ignores.

  deploy      glue's select + pack + ship.upload (the object not in the bucket yet: deleted before each
              round), through deploy's client (glue.storage.bucket.client, checksums=False), vs the system
              `tar -cf` of the same folder + one raw boto3 upload_file of that tar (default TransferConfig)
              to the same server. Goal: baseline/glue >= 0.9.
  re-deploy   the same tree again: upload must move nothing (checked); the hashing time (select + pack)
              against the 1 s goal.
  recovery    the VM side: wheels fetched from the bucket wheelhouse (sha256-checked) + venv.create +
              venv.install_offline, vs venv.create + `pip install <the same pins>` from the configured
              package index. On this machine that index is a local file mirror (pip.conf), so the ratio
              understates the gain against a remote registry.

Rounds alternate the order of ours and the baseline; each figure is the median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.cloud.local.bucket import LocalBucket
from glue.storage.bucket import client as bucket_client
from glue.train.layout import code_index_key, code_key, wheelhouse_index_key, wheelhouse_prefix
from glue.train.storage.target import open_target
from glue.train.workspace import venv, wheelhouse
from glue.train.workspace.pins import set_hash
from glue.workdir import ship
from glue.workdir.pack import pack, sha256_of
from glue.workdir.select import select

MB = 1e6
GOAL_DEPLOY_RATIO = 0.9   # baseline / glue
GOAL_REHASH_S = 1.0
CAP_MB = 1024
# Small pure-Python wheels the machine's pip configuration serves, none of them in the image (.venv): a
# package the image already has would be "already satisfied" through the venv's .pth, and install nothing.
PINS = ["einops==0.8.2", "humanize==4.16.0", "tabulate==0.10.0", "termcolor==3.3.0", "toolz==1.1.0"]


class BenchFailure(SystemExit):
    pass


def make_tree(root: Path, files: int, size_mb: float, seed: int = 32) -> dict[str, int]:
    """`files` files of random bytes, `size_mb` MB in all, in nested folders; a .gitignore and what it ignores."""
    rng = random.Random(seed)
    each = int(size_mb * MB / files)
    total = 0
    for i in range(files):
        top, sub = i % 10, (i // 10) % 5
        folder = root / "src" / f"pkg{top}" / (f"mod{sub}" if i % 3 else "")
        folder.mkdir(parents=True, exist_ok=True)
        n = each + rng.randint(-each // 10, each // 10)
        (folder / f"file{i:04d}.py").write_bytes(os.urandom(n))
        total += n
    (root / ".gitignore").write_text("*.log\nresults/\n.venv/\n")
    (root / "results").mkdir()
    for i in range(5):
        (root / "results" / f"ckpt{i}.bin").write_bytes(os.urandom(4096))
        (root / f"run{i}.log").write_text("ignored\n")
    return {"files": files, "bytes": total}


def glue_deploy(root: Path, s3: Any, bucket: str) -> dict[str, Any]:
    """select + pack + upload, timed in parts. The package's temp file is removed after the clock stops."""
    t0 = time.perf_counter()
    sel = select(root)
    t1 = time.perf_counter()
    pkg = pack(sel, CAP_MB)
    t2 = time.perf_counter()
    try:
        moved = ship.upload(s3, bucket, pkg)
        t3 = time.perf_counter()
    finally:
        pkg.close()
    return {"select_s": t1 - t0, "pack_s": t2 - t1, "upload_s": t3 - t2, "total_s": t3 - t0,
            "hash_s": t2 - t0, "moved": moved, "sha256": pkg.sha256, "size": pkg.size,
            "files": len(pkg.files), "ignored": len(sel.ignored)}


def baseline_deploy(root: Path, raw: Any, bucket: str, key: str, scratch: Path) -> dict[str, Any]:
    """The system tar of the folder + one raw boto3 upload_file of it."""
    tar = scratch / "baseline.tar"
    t0 = time.perf_counter()
    subprocess.run(["tar", "-cf", str(tar), "-C", str(root), "."], check=True)
    t1 = time.perf_counter()
    raw.upload_file(str(tar), bucket, key)
    t2 = time.perf_counter()
    size = tar.stat().st_size
    tar.unlink()
    return {"tar_s": t1 - t0, "upload_s": t2 - t1, "total_s": t2 - t0, "size": size}


def forget(s3: Any, bucket: str, sha: str) -> None:
    """The package out of the bucket again, so the next round's upload is a first one."""
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": code_key(sha)}, {"Key": code_index_key(sha)}]})


def bench_deploy(root: Path, s3: Any, raw: Any, bucket: str, rounds: int, scratch: Path) -> dict[str, Any]:
    ours: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    sha = None
    for i in range(rounds):
        for who in (("glue", "tar") if i % 2 == 0 else ("tar", "glue")):
            if who == "glue":
                if sha:
                    forget(s3, bucket, sha)
                r = glue_deploy(root, s3, bucket)
                if not r["moved"]:
                    raise BenchFailure(f"deploy round {i + 1}: the package was not in the bucket, yet nothing moved")
                if sha and r["sha256"] != sha:
                    raise BenchFailure(f"deploy round {i + 1}: the same tree packed to a different sha256")
                sha = r["sha256"]
                ours.append(r)
            else:
                base.append(baseline_deploy(root, raw, bucket, f"bench/baseline-{i}.tar", scratch))
            print(f"  deploy round {i + 1} {who:4}: {(ours if who == 'glue' else base)[-1]['total_s']:.2f} s",
                  file=sys.stderr)
    head = raw.head_object(Bucket=bucket, Key=code_key(str(sha)))
    if int(head["ContentLength"]) != ours[-1]["size"]:
        raise BenchFailure("the uploaded package's size differs from the packed one")
    med = {k: statistics.median(r[k] for r in ours) for k in ("select_s", "pack_s", "upload_s", "total_s")}
    bmed = {k: statistics.median(r[k] for r in base) for k in ("tar_s", "upload_s", "total_s")}
    return {"glue": med, "baseline": bmed, "ratio": bmed["total_s"] / med["total_s"], "sha256": sha,
            "package_bytes": ours[-1]["size"], "baseline_tar_bytes": base[-1]["size"],
            "package_files": ours[-1]["files"], "ignored": ours[-1]["ignored"], "rounds_glue": ours,
            "rounds_baseline": base}


def bench_redeploy(root: Path, s3: Any, bucket: str, rounds: int, sha: str) -> dict[str, Any]:
    runs = []
    for i in range(rounds):
        r = glue_deploy(root, s3, bucket)
        if r["moved"]:
            raise BenchFailure(f"re-deploy round {i + 1}: an unchanged tree was uploaded again")
        if r["sha256"] != sha:
            raise BenchFailure(f"re-deploy round {i + 1}: the unchanged tree packed to a different sha256")
        runs.append(r)
        print(f"  re-deploy round {i + 1}: hash {r['hash_s']:.2f} s, head {r['upload_s'] * 1000:.0f} ms, "
              "nothing uploaded", file=sys.stderr)
    med = {k: statistics.median(r[k] for r in runs) for k in ("select_s", "pack_s", "hash_s", "upload_s", "total_s")}
    return {**med, "uploaded": False, "goal_hash_s": GOAL_REHASH_S, "ratio_to_goal": med["hash_s"] / GOAL_REHASH_S,
            "rounds": runs}


def build_wheelhouse(s3: Any, bucket: str, scratch: Path) -> tuple[str, dict[str, str], int]:
    """The pins' wheels downloaded with the machine's pip configuration and stored as a set in the bucket."""
    folder = scratch / "download"
    res = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps",
                          "--quiet", "-d", str(folder), *PINS], capture_output=True, text=True)
    if res.returncode != 0:
        raise BenchFailure(f"pip download of {PINS} failed: {(res.stderr or res.stdout).strip()[-500:]}")
    wheels = {p.name: sha256_of(p) for p in sorted(folder.glob("*.whl"))}
    if len(wheels) != len(PINS):
        raise BenchFailure(f"pip download gave {len(wheels)} wheels for {len(PINS)} pins: {sorted(wheels)}")
    digest = set_hash(PINS, {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "platform": sys.platform})
    for name in wheels:
        s3.upload_file(str(folder / name), bucket, wheelhouse_prefix(digest) + name)
    s3.put_object(Bucket=bucket, Key=wheelhouse_index_key(digest),
                  Body=json.dumps({"pins": PINS, "wheels": wheels, "set_sha256": digest}).encode())
    return digest, wheels, sum((folder / name).stat().st_size for name in wheels)


def bench_recovery(storage: Any, digest: str, wheels: dict[str, str], rounds: int, scratch: Path) -> dict[str, Any]:
    ours: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    for i in range(rounds):
        for who in (("glue", "registry") if i % 2 == 0 else ("registry", "glue")):
            vdir = scratch / f"venv-{who}-{i}"
            if who == "glue":
                house = scratch / f"wheelhouse-{i}"
                t0 = time.perf_counter()
                wheelhouse.fetch(storage, digest, wheels, house)
                t1 = time.perf_counter()
                venv.create(vdir)
                t2 = time.perf_counter()
                venv.install_offline(vdir, house, PINS)
                t3 = time.perf_counter()
                ours.append({"fetch_s": t1 - t0, "create_s": t2 - t1, "install_s": t3 - t2, "total_s": t3 - t0})
            else:
                t0 = time.perf_counter()
                venv.create(vdir)
                t1 = time.perf_counter()
                res = venv.pip(vdir, "install", *PINS)
                t2 = time.perf_counter()
                if res.returncode != 0:
                    raise BenchFailure(f"pip install from the index failed: {venv.pip_problem(res)}")
                base.append({"create_s": t1 - t0, "install_s": t2 - t1, "total_s": t2 - t0})
            venv.check(vdir, PINS)  # raises unless the venv holds exactly the pins (not timed)
            shutil.rmtree(vdir)
            print(f"  recovery round {i + 1} {who:8}: {(ours if who == 'glue' else base)[-1]['total_s']:.2f} s",
                  file=sys.stderr)
    med = {k: statistics.median(r[k] for r in ours) for k in ("fetch_s", "create_s", "install_s", "total_s")}
    bmed = {k: statistics.median(r[k] for r in base) for k in ("create_s", "install_s", "total_s")}
    return {"pins": PINS, "set_sha256": digest, "glue": med, "baseline": bmed,
            "ratio": bmed["total_s"] / med["total_s"], "rounds_glue": ours, "rounds_baseline": base,
            "registry": "the configured pip index: a local file mirror on this machine"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="gpukit-bench-workdir-"))
    server = LocalBucket(scratch / "home")
    try:
        info = server.ensure_running()
        creds = server.credentials()
        # The client `glue deploy` uploads the package with: no CRC of the body (the VM checks its sha256).
        s3 = bucket_client(info, creds, timeout=60, checksums=False)
        raw = boto3.client("s3", endpoint_url=info.endpoint, aws_access_key_id=creds.access_key,
                           aws_secret_access_key=creds.secret_key, region_name="us-east-1",
                           config=Config(s3={"addressing_style": "path"}))
        root = scratch / "workdir"
        root.mkdir()
        tree = make_tree(root, args.files, args.size_mb)
        print(f"tree: {tree['files']} files, {tree['bytes'] / MB:.1f} MB; bucket {info.endpoint}", file=sys.stderr)

        deploy = bench_deploy(root, s3, raw, info.name, args.rounds, scratch)
        redeploy = bench_redeploy(root, s3, info.name, args.rounds, deploy["sha256"])
        digest, wheels, wheel_bytes = build_wheelhouse(s3, info.name, scratch)
        # The VM's reader of the bucket (glue.train.storage.target.open_bucket), opened once per attempt.
        storage = open_target(f"s3://{info.name}", endpoint_url=info.endpoint, region=info.region,
                              credentials=lambda: creds, check=False)
        recovery = {**bench_recovery(storage, digest, wheels, args.rounds, scratch), "wheel_bytes": wheel_bytes}
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    g, b = deploy["glue"], deploy["baseline"]
    print()
    print(f"workdir: {tree['files']} files, {tree['bytes'] / MB:.1f} MB "
          f"(package {deploy['package_bytes'] / MB:.1f} MB, {deploy['package_files']} files; "
          f"{deploy['ignored']} ignored); median of {args.rounds} rounds, {os.cpu_count()} CPUs")
    print(f"{'figure':34} {'glue':>8} {'baseline':>9} {'ratio':>7}  goal")
    print(f"{'deploy (select+pack+upload)':34} {g['total_s']:7.2f}s {b['total_s']:8.2f}s "
          f"{deploy['ratio']:6.2f}x  baseline/glue >= {GOAL_DEPLOY_RATIO}")
    print(f"{'  select / pack / upload':34} {g['select_s']:.2f}/{g['pack_s']:.2f}/{g['upload_s']:.2f}s  "
          f"baseline tar {b['tar_s']:.2f}s + upload {b['upload_s']:.2f}s")
    print(f"{'re-deploy: hash (select+pack)':34} {redeploy['hash_s']:7.2f}s {GOAL_REHASH_S:8.2f}s "
          f"{redeploy['ratio_to_goal']:6.2f}x  hash/goal <= 1 (nothing uploaded; HEAD "
          f"{redeploy['upload_s'] * 1000:.0f} ms)")
    rg, rb = recovery["glue"], recovery["baseline"]
    print(f"{'recovery venv (bucket vs index)':34} {rg['total_s']:7.2f}s {rb['total_s']:8.2f}s "
          f"{recovery['ratio']:6.2f}x  index/bucket (no goal)")
    print(f"{'  fetch / create / install':34} {rg['fetch_s']:.2f}/{rg['create_s']:.3f}/{rg['install_s']:.2f}s  "
          f"baseline create {rb['create_s']:.3f}s + pip install {rb['install_s']:.2f}s")
    print(f"recovery: {len(PINS)} wheels, {recovery['wheel_bytes'] / 1e3:.0f} kB. The index here is a local file "
          "mirror (pip.conf), so this ratio understates the gain against a remote registry.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"tree": tree, "rounds": args.rounds, "cpus": os.cpu_count(),
                                         "deploy": deploy, "redeploy": redeploy, "recovery": recovery,
                                         "goal_deploy_ratio": GOAL_DEPLOY_RATIO, "goal_rehash_s": GOAL_REHASH_S},
                                        indent=2))


if __name__ == "__main__":
    main()

"""Arm an idle spare (run on it by glue.operations.warm_spares, with the trainer venv's python):

    python -m glue.train.spare.arm SPEC.json

SPEC: {"bucket": {...}, "credentials_file": ..., "image": {"runs": [<run>...], "env": {...}, "secrets": [...]},
       "envs": [{"requirements": {"set_sha256", "pins"}, "runs": [...], "env": {...}, "secrets": [...]}, ...]}
(env: a followed run's declared variables, secrets: the runs' secret names; glue.train.run.warm_follow)

- the trainer venv's warm process (glue.train.run.warm) is started unless one runs, following the live
  runs that use the trainer venv;
- each live run's environment (at most MAX_ENVS) is made ready from its pack in the bucket, exactly as a
  recovery's prepare would (glue.train.workspace.environment: the pins checked), and a warm process is
  started with its interpreter, following the runs of that environment. A set with no pack yet is skipped
  (the spare never builds from the wheelhouse: that is the first VM's work);
- warm processes of environments no live run uses any more are ended (their memory is the next attempt's).

The followed runs are rewritten every time (glue.train.run.warm_follow reads them again), so arming again
changes what is preloaded without a new process. One JSON line on stdout says what was done; one arming at
a time (a lock in the warm folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from glue.train.run.start import socket_for, socket_path, warm_dir, warm_pid
from glue.train.storage.target import open_bucket
from glue.train.workspace import envstore, venv
from glue.train.workspace.environment import from_pack, locked
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import MEMORY_ROOT, WorkPaths

MAX_ENVS = 2  # each warm process holds torch and the run's imports: a few hundred MB of the spare's memory
MIN_FREE_BYTES = 2 * 2**30  # below this much free memory a spare starts no warm process for a run environment


def _write_private(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _free_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def ensure_process(python: str, sock: str, follow: dict[str, Any], need_free: int = 0) -> str:
    """The warm process for `sock` running with `python`, following `follow`'s runs: running or started
    (not started with less than `need_free` bytes of memory free)."""
    _write_private(Path(f"{sock}.follow.json"), json.dumps(follow))
    if warm_pid(f"{sock}.pid") or warm_pid(f"{sock}.starting"):
        return "running"
    if _free_bytes() < need_free:
        return f"not started: less than {need_free / 2**30:.0f} GiB of memory free"
    with open(os.path.join(warm_dir(), "warm.log"), "ab") as log:
        proc = subprocess.Popen([python, "-m", "glue.train.run.warm", "--follow", f"{sock}.follow.json", sock],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", start_new_session=True)
    _write_private(Path(f"{sock}.starting"), f"{proc.pid}\n")
    return "started"


def ready_env(spec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """The set's environment on this VM, from its pack: {python, source} or {note} when it cannot be."""
    paths = WorkPaths("spare", 0, memory=MEMORY_ROOT)
    digest = str(req["set_sha256"])
    env = paths.env_dir(digest)
    with locked(paths.env_lock(digest)):
        if venv.is_ready(env, digest, list(req["pins"])):
            return {"python": str(venv.python_of(env)), "source": "reused"}
        storage = open_bucket(spec)
        index = envstore.find(storage, digest)
        if index is None:
            return {"note": "no VM has packed this dependency set yet"}
        got = from_pack(storage, paths, req, index)
    if "source" not in got:
        return {"note": str(got["note"])}
    return {"python": str(venv.python_of(env)), "source": "pack", "seconds": got.get("unpack_s")}


def end_stale(wanted: set[str]) -> list[int]:
    """SIGTERM to the warm processes of environments not wanted any more."""
    ended = []
    for sock in {p[:p.index(".sock") + 5] for p in glob.glob(os.path.join(warm_dir(), "env-*.sock*"))}:
        if sock in wanted:
            continue
        for mark in (f"{sock}.pid", f"{sock}.starting"):
            pid = warm_pid(mark)
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
                ended.append(pid)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{sock}.follow.json")
    return ended


def _followed(item: dict[str, Any]) -> dict[str, Any]:
    return {"runs": list(item.get("runs", [])), "env": dict(item.get("env") or {}),
            "secrets": list(item.get("secrets", []))}


def arm(spec: dict[str, Any]) -> dict[str, Any]:
    bucket = {"bucket": spec["bucket"], "credentials_file": spec.get("credentials_file")}
    out: dict[str, Any] = {"trainer": ensure_process(sys.executable, socket_path(), {**bucket, **_followed(
        spec.get("image") or {})}), "envs": []}
    wanted = set()
    for item in list(spec.get("envs", []))[:MAX_ENVS]:
        req = item["requirements"]
        said: dict[str, Any] = {"set": str(req["set_sha256"])[:16]}
        try:
            got = ready_env(spec, req)
        except (WorkspaceError, OSError) as exc:
            got = {"note": str(exc)}
        if "python" in got:
            sock = socket_for(got["python"])
            wanted.add(sock)
            said.update(environment=got["source"], warm=ensure_process(got["python"], sock,
                                                                       {**bucket, **_followed(item)}, MIN_FREE_BYTES))
        else:
            said.update(environment="none", note=got["note"])
        out["envs"].append(said)
    out["ended"] = end_stale(wanted)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m glue.train.spare.arm SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    os.makedirs(warm_dir(), mode=0o700, exist_ok=True)
    os.chmod(warm_dir(), 0o700)
    with open(os.path.join(warm_dir(), "arm.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(json.dumps(arm(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

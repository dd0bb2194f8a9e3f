"""The run's virtualenv on this VM, the fastest way that is still exactly the manifest's pinned set:

  reused     the set's venv is already here and still holds the pins (a --same-vm recovery)
  pack       another VM packed the set (envs/<set>/ in the bucket): fetched, its sha256 checked (against the
             run's manifest too, which pins the pack its first attempt used), unpacked at
             the set's path (in memory when it fits), and its installed distributions checked against the
             manifest's pins (importlib.metadata). A pack whose bytes or pins differ is refused.
  wheelhouse no pack yet (the set's first VM): installed from the bucket's wheelhouse, then packed and
             stored for every later VM

Every way ends in the same check of the pins; nothing is read from a package index.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from glue.train.layout import env_pack_index_key
from glue.train.storage.target import Storage
from glue.train.workspace import envbuild, envpack, envstore, venv
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import WorkPaths

# An environment goes into memory (WorkPaths.memory) only when it takes at most this share of what the VM
# has free there and in RAM: the trainer's own memory comes first.
MEMORY_SHARE = 0.25


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def in_memory(memory: Path | None, need: int) -> bool:
    """Whether `need` bytes fit the memory share (a tmpfs at `memory`'s parent, and RAM)."""
    if memory is None or not memory.parent.is_dir():
        return False
    st = os.statvfs(memory.parent)
    return need <= MEMORY_SHARE * min(st.f_bavail * st.f_frsize, _mem_available())


def _place(paths: WorkPaths, digest: str, need: int) -> Path:
    """env_dir made anew and empty: a link into memory when the environment fits there, else a folder.
    Returns the folder itself."""
    env = paths.env_dir(digest)
    venv.remove(env)
    env.parent.mkdir(parents=True, exist_ok=True)
    if paths.memory is not None and in_memory(paths.memory, need):
        real = paths.memory / env.name
        if real.exists():
            shutil.rmtree(real)
        real.mkdir(parents=True)
        env.symlink_to(real, target_is_directory=True)
        return real
    env.mkdir()
    return env


def from_pack(storage: Storage, paths: WorkPaths, req: dict[str, Any], index: dict[str, Any]) -> dict[str, Any]:
    """The set's environment from its pack ({source: pack, …}), or {note} saying why the pack cannot serve
    (gone from the bucket, made for another path)."""
    digest, pins = str(req["set_sha256"]), list(req["pins"])
    env = paths.env_dir(digest)
    pinned = req.get("pack_sha256")
    if pinned and index["sha256"] != pinned:  # the run's manifest pinned the pack its first attempt used
        raise WorkspaceError(f"the set's packed environment in the bucket ({env_pack_index_key(digest)}: sha256 "
                             f"{index['sha256']}) is not the {pinned} this run's manifest pins: it was replaced "
                             "in the bucket; not using it")
    if index["prefix"] != str(env):
        return {"note": f"the set's packed environment was made for {index['prefix']}, not this VM's {env}"}
    t0 = time.monotonic()
    data = envstore.fetch(storage, index)
    if data is None:
        return {"note": f"the set's packed environment {index.get('key')} is not in the bucket"}
    fetched = time.monotonic()
    real = _place(paths, digest, int(index["unpacked_bytes"]))
    try:
        venv.skeleton(real)  # venv refuses a link; the pack's own scripts name env, not real
        files = envpack.unpack(data, real)
        venv.check(env, pins)
    except (WorkspaceError, OSError) as exc:  # OSError: this VM's disk or memory (full, read-only)
        venv.remove(env)
        raise WorkspaceError(f"the set's packed environment {index['key']}: {exc}") from None
    venv.mark(env, digest)
    return {"source": "pack", "key": index["key"], "sha256": index["sha256"], "bytes": len(data), "files": files,
            "in_memory": real != env, "fetch_s": round(fetched - t0, 3),
            "unpack_s": round(time.monotonic() - fetched, 3)}


def pack_and_store(storage: Storage, paths: WorkPaths, digest: str) -> dict[str, Any]:
    """The environment just built from the wheelhouse, packed into the bucket for the next VM."""
    t0 = time.monotonic()
    env = paths.env_dir(digest)
    data, meta = envpack.pack(env)
    packed = time.monotonic()
    index = envstore.store(storage, digest, data, {**meta, "prefix": str(env)})
    return {"key": index["key"], "sha256": index["sha256"], "bytes": index["size"],
            "pack_s": round(packed - t0, 3), "store_s": round(time.monotonic() - packed, 3)}


def ready(storage: Storage, paths: WorkPaths, req: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The run's python for the set, and how its environment came to be: {source, seconds, note, …}."""
    digest, pins = str(req["set_sha256"]), list(req["pins"])
    t0 = time.monotonic()
    with locked(paths.env_lock(digest)):
        info: dict[str, Any] = {"source": "reused"}
        if not venv.is_ready(paths.env_dir(digest), digest, pins):
            index = envstore.find(storage, digest)
            got = from_pack(storage, paths, req, index) if index else {
                "note": "no VM has packed this dependency set yet"}
            info = got if "source" in got else _from_wheelhouse(storage, paths, req, str(got["note"]))
        python = envbuild.link(paths, digest)
    info["seconds"] = round(time.monotonic() - t0, 3)
    return python, info


def _from_wheelhouse(storage: Storage, paths: WorkPaths, req: dict[str, Any], why: str) -> dict[str, Any]:
    digest = str(req["set_sha256"])
    envbuild.from_wheelhouse(storage, paths, req)
    note = f"{why}: installed {len(req['pins'])} pinned packages from the wheelhouse"
    try:
        stored = pack_and_store(storage, paths, digest)
    except (WorkspaceError, OSError) as exc:
        return {"source": "wheelhouse", "note": f"{note}; could not pack it for the next VM: {exc}"}
    return {"source": "wheelhouse", "note": f"{note}, and packed it for the next VM", "stored": stored}

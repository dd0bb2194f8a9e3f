"""The supervisor `glue deploy` starts on the VM: runs the trainer, ships its log to the bucket,
applies a memory limit, and writes the exit record the classifier reads.

    python -m glue.train.run.supervise /run/gpukit/runs/<run>/attempt-<n>.json [--cold-reason <why>]

The launch spec (0600, on the VM's tmpfs /run) holds the command and the trainer's environment,
secrets included, so none of it appears in any process's arguments.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from glue.train.errors import StorageError
from glue.train.layout import exit_key, log_key, run_uri
from glue.train.run.launch import LaunchSpec
from glue.train.state_paths import StatePaths
from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.mount import MOUNT, mount_path
from glue.train.storage.target import Storage, open_target
from glue.train.utc import iso, utc_now

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_MEM = Path("/sys/fs/cgroup/memory")


class MemoryLimit:
    """A memory cgroup for the trainer (v2 or v1) so an overrun is killed by the kernel OOM killer
    and leaves an `oom_kill` record; RLIMIT_AS when no cgroup is writable."""

    def __init__(self, name: str, limit_mb: int) -> None:
        self.limit = limit_mb * 2**20
        self.path: Path | None = None
        self.v2 = (CGROUP_V2 / "cgroup.controllers").exists()
        base = CGROUP_V2 if self.v2 else CGROUP_V1_MEM
        try:
            path = base / name
            path.mkdir(exist_ok=True)
            (path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(self.limit))
            if self.v2:
                (path / "memory.swap.max").write_text("0")
            self.path = path
        except OSError:
            self.path = None

    def preexec(self) -> None:
        """Runs in the child before exec: join the cgroup, or cap the address space."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text("0")
        else:
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def oom_kills(self) -> int:
        if self.path is None:
            return 0
        try:
            text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, val = line.partition(" ")
            if key == "oom_kill":
                return int(val)
        return 0

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


class LogShipper(threading.Thread):
    """Copies new bytes of the local log to runs/<run>/logs/<attempt>-<part>.log every few seconds."""

    def __init__(self, log: Path, store: Storage, attempt: int, node: int, every_s: float) -> None:
        super().__init__(name="gpukit-logship", daemon=True)
        self.log, self.store, self.attempt, self.node, self.every_s = log, store, attempt, node, every_s
        self.offset, self.part = 0, 0
        self.done = threading.Event()

    def ship(self) -> None:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        if not data:
            return
        try:
            self.store.put(log_key(self.attempt, self.node, self.part + 1), data)
        except StorageError:
            return  # try again next round with the same bytes
        self.part += 1
        self.offset += len(data)

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.ship()


class Trainer(Protocol):
    """The started trainer as the supervisor drives it: a subprocess.Popen, or a warm process's fork
    (glue.train.run.warm_child.Forked): wait() is the exit code, negative for the signal that ended it."""

    pid: int

    def send_signal(self, sig: int) -> None: ...

    def wait(self) -> int: ...


def start_ticks(pid: int) -> int:
    """When the process started (clock ticks since boot, /proc/<pid>/stat field 22): with its pid, what names
    this very process. A VM reuses pids within minutes (its trainers' threads take them too), so glue checks
    both before it probes or signals an attempt's process (glue.runs.remote). 0: it is gone already."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


# How the trainer is started: (spec, the open log, the memory limit or None, its environment) -> Trainer.
Starter = Callable[[LaunchSpec, IO[bytes], "MemoryLimit | None", dict[str, str]], Trainer]


def cold_start(spec: LaunchSpec, log: IO[bytes], limit: MemoryLimit | None, env: dict[str, str]) -> Trainer:
    """A new process running the spec's command (its interpreter starts and imports everything anew)."""
    return subprocess.Popen(
        spec.command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        cwd=spec.cwd or "/", preexec_fn=limit.preexec if limit else None,
    )


def main(spec_path: str, start: Starter = cold_start, how: dict[str, str] | None = None) -> int:
    """Run the attempt of `spec_path` to its end. `how`: how the trainer was started, into the pids file
    (and so the attempt record): {"start": "warm"} or {"start": "cold", "cold_reason": ...}."""
    spec = LaunchSpec.from_json(Path(spec_path).read_bytes())
    run, attempt = spec.run, spec.attempt
    paths = StatePaths.of_spec(spec_path, attempt)
    log_path = Path(paths.log)
    cred_file = spec.credentials_file
    records = run_uri(spec.bucket.name, run)
    if spec.bucket.via == "mount":  # a serverless run: the bucket only at the platform's mount
        records = mount_path(records, spec.bucket.name, spec.bucket.mount or MOUNT)
    store = open_target(
        records, endpoint_url=spec.bucket.endpoint, region=spec.bucket.region,
        credentials=(lambda: credentials_from_file(cred_file)) if cred_file else None, check=False,
    )
    limit = MemoryLimit(f"gpukit-{run}-{attempt}", spec.memory_limit_mb) if spec.memory_limit_mb else None
    env = {**os.environ, **spec.env}
    with open(log_path, "ab") as log:
        child = start(spec, log, limit, env)
    # Whole or absent: glue reads it over SSH (glue.runs.remote.process_state) while it may be written.
    tmp = Path(f"{paths.pids}.tmp")
    tmp.write_text(json.dumps({"supervisor_pid": os.getpid(), "trainer_pid": child.pid,
                               "supervisor_start": start_ticks(os.getpid()), "trainer_start": start_ticks(child.pid),
                               "started_at": iso(utc_now()), **(how or {"start": "cold"})}))
    os.replace(tmp, paths.pids)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    # Node k of a multi-node attempt ships to its own keys (node 0 keeps the single-node names).
    node = spec.node
    shipper = LogShipper(log_path, store, attempt, node, spec.log_every_s)
    shipper.start()
    code = child.wait()
    shipper.done.set()
    shipper.join(timeout=5)
    shipper.ship()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = {
        "run": run, "attempt": attempt, "node": node, "ended_at": iso(utc_now()),
        "exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
        "oom_kills": limit.oom_kills() if limit else 0,
        "memory_limit_mb": spec.memory_limit_mb, "max_rss_mb": usage.ru_maxrss / 1024,
    }
    for delay in (0.5, 1, 2, 4, 8):
        try:
            store.put(exit_key(attempt, node), json.dumps(record).encode())
            break
        except StorageError:
            time.sleep(delay)
    if limit:
        limit.remove()
    return code if code >= 0 else 128 - code


def entry(argv: list[str]) -> int:
    """`<spec> [--cold-reason <why>]`: the reason comes from glue.train.run.start, when a warm trainer
    process was there but could not take the attempt."""
    if len(argv) == 3 and argv[1] == "--cold-reason":
        return main(argv[0], how={"start": "cold", "cold_reason": argv[2]})
    return main(argv[0])


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))

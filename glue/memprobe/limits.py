"""The memory limit a trial process runs under, so that "does not fit" is observable.

Host memory (device cpu): a memory cgroup (v2, or v1 at /sys/fs/cgroup/memory) per trial, made by
glue.train.run.supervise.MemoryLimit — the same limit `glue deploy --memory-limit-mb` puts on a
trainer, so an overrun is a SIGKILL with an `oom_kill` record, exactly as in the run. Without a
writable cgroup (or with mechanism "rlimit") RLIMIT_AS caps the address space instead; that is
virtual memory (torch alone maps ~0.7 GB), so the same number means less room.
GPU memory (device cuda): the worker caps the caching allocator at the limit
(torch.cuda.set_per_process_memory_fraction), so a smaller GPU can be imitated on a bigger one.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from glue.errors import GlueError
from glue.train.run.supervise import MemoryLimit

MECHANISMS = ("auto", "cgroup", "rlimit")
_seq = itertools.count(1)


class TrialLimit:
    """A host-memory limit for one trial process: cgroup or RLIMIT_AS (see the module doc)."""

    def __init__(self, limit_mb: int, mechanism: str = "auto") -> None:
        if mechanism not in MECHANISMS:
            raise GlueError(f"unknown limit mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")
        if limit_mb < 1:
            raise GlueError(f"--memory-limit-mb must be a positive number of MB, got {limit_mb}")
        self.limit_mb = limit_mb
        self._mem = MemoryLimit(f"gpukit-memprobe-{os.getpid()}-{next(_seq)}", limit_mb)
        if mechanism == "rlimit" and self._mem.path is not None:
            self._mem.remove()
            self._mem.path = None
        if mechanism == "cgroup" and self._mem.path is None:
            raise GlueError("cannot create a memory cgroup here (needs root and a mounted memory controller); "
                            "use --limit-mechanism rlimit")
        if self._mem.path is not None and not self._mem.v2:
            memsw = self._mem.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # no escape into swap either
                try:
                    memsw.write_text(str(self._mem.limit))
                except OSError:
                    pass

    @property
    def mechanism(self) -> str:
        if self._mem.path is None:
            return "rlimit"
        return "cgroup-v2" if self._mem.v2 else "cgroup-v1"

    @property
    def path(self) -> Path | None:
        return self._mem.path

    def describe(self) -> str:
        if self._mem.path is None:
            return f"RLIMIT_AS {self.limit_mb} MB (address space)"
        return f"{self.mechanism} {self._mem.path} limit {self.limit_mb} MB"

    def preexec(self) -> None:
        self._mem.preexec()

    def oom_kills(self) -> int:
        return self._mem.oom_kills()

    def peak_mb(self) -> float | None:
        """The cgroup's own high-water mark (RSS + page cache charged to it)."""
        if self._mem.path is None:
            return None
        name = "memory.peak" if self._mem.v2 else "memory.max_usage_in_bytes"
        try:
            return round(int((self._mem.path / name).read_text().split()[0]) / 2**20, 1)
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> None:
        self._mem.remove()


def _meminfo_mb(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_mb() -> int | None:
    """MemAvailable from /proc/meminfo, in MB."""
    return _meminfo_mb("MemAvailable")


def total_mb() -> int | None:
    """MemTotal from /proc/meminfo, in MB: no host-memory limit above it can hold a trial."""
    return _meminfo_mb("MemTotal")


def safety_limit_mb() -> int | None:
    """90% of the memory available now: the cap for a CPU trial when no limit was asked for, so an
    input too big for this machine ends as a reported OOM rather than the host's OOM killer."""
    avail = available_mb()
    return int(avail * 0.9) if avail else None

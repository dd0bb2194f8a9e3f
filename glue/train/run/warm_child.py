"""The warm trainer's start: the supervisor (glue.train.run.supervise, running inside the warm process)
forks instead of starting a new interpreter, and the child runs the attempt's module or script in-process
(runpy) with the launch spec's argv, environment and cwd.

To the monitor the attempt is the same as a cold one: the supervisor's pid and the trainer's in the pids
file, the trainer's stdout and stderr in the attempt's log, stdin from /dev/null, the memory limit joined
before the trainer's code runs, SIGTERM/SIGINT forwarded to it, and its exit code or the signal that
killed it (kill -9 included) in the exit record. The child leaves the supervisor's frames by raising
BecomeTrainer up to the warm process's entry (glue.train.run.warm), which then runs it: the
interpreter's own end (atexit, non-daemon threads, an uncaught exception's traceback and exit 1)
follows as for `python -m <module>`.
"""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
from typing import IO, TYPE_CHECKING

from glue.train.run.launch import LaunchSpec
from glue.train.run.warm_fit import Entry

if TYPE_CHECKING:
    from glue.train.run.supervise import MemoryLimit, Starter


class Forked:
    """The forked trainer as the supervisor drives a subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


class BecomeTrainer(BaseException):
    """Raised in the forked child only: carries what to run up to the warm process's entry."""

    def __init__(self, entry: Entry, env: dict[str, str]) -> None:
        super().__init__("warm trainer start")
        self.entry, self.env = entry, env


def fork_starter(entry: Entry) -> Starter:
    """A supervise.Starter that forks this (warm) process for the trainer."""

    def start(spec: LaunchSpec, log: IO[bytes], limit: MemoryLimit | None, env: dict[str, str]) -> Forked:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return Forked(pid)
        try:
            _as_trainer(spec, log, limit)
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the supervisor
            os.write(2, f"gpukit: the warm trainer could not start: {exc}\n".encode())
            os._exit(1)
        raise BecomeTrainer(entry, env)

    return start


def _as_trainer(spec: LaunchSpec, log: IO[bytes], limit: MemoryLimit | None) -> None:
    """In the child: what Popen would have given a new process (signals, stdio, cgroup, cwd)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    if limit is not None:
        limit.preexec()
    os.chdir(spec.cwd or "/")


def _stream(fd: int, unbuffered: bool, line: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    if unbuffered:
        return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace",
                            line_buffering=line)


def run(become: BecomeTrainer) -> None:
    """In the child, at the warm process's entry: the attempt's environment, streams, argv and sys.path as
    `python -m <module>` (or `python <script>`) would have them, then its code as __main__."""
    env, entry = become.env, become.entry
    os.environ.clear()
    os.environ.update(env)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout = _stream(1, unbuffered, line=False)
    sys.stderr = _stream(2, True, line=True)
    threads = env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS")
    if threads:  # a new interpreter's torch reads it when its thread pool starts; this one is told
        import torch

        torch.set_num_threads(int(threads))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entry.module is not None:
        sys.argv = [entry.module, *entry.args]  # runpy sets argv[0] to the module's file
        sys.path[0:1] = [os.getcwd(), *extra]
        runpy.run_module(entry.module, run_name="__main__", alter_sys=True)
        return
    assert entry.script is not None
    sys.argv = [entry.script, *entry.args]
    sys.path[0:1] = [os.path.dirname(os.path.abspath(entry.script)), *extra]
    runpy.run_path(entry.script, run_name="__main__")

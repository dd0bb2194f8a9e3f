"""Whether a warm trainer process (glue.train.run.warm) can run an attempt in its own interpreter.

It can when the attempt is `<python> -m <module> ...` or `<python> <script> ...` with a python of this
process's environment (a run's venv link and the set's folder it points to are one environment),
sets no variable that only an interpreter's start reads (PYTHONPATH, PYTHONUNBUFFERED and the thread
counts OMP_NUM_THREADS / MKL_NUM_THREADS excepted: the warm child applies them itself) and the
interpreter's packages are as they were when the process started. Anything else (another environment
than this process's, a docker runtime, a torchrun group, interpreter options) is a cold start, and
`refusal` says why in one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass

from glue.train.run.launch import LaunchSpec
from glue.train.run.start import venv_root

# Read once when an interpreter or its native libraries start: a warm process already past that cannot
# honour a new value.
START_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "MALLOC_")
IN_PROCESS = frozenset({"PYTHONUNBUFFERED", "PYTHONPATH"})
THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # applied in-process with torch.set_num_threads
GLUE_PREFIX = "GPUKIT_"  # the attempt's own variables (TrainerEnv): read by glue at run time, never on import
TORCHRUN = frozenset({"glue.train.run.process_group", "torch.distributed.run", "torch.distributed.launch"})


@dataclass(frozen=True)
class Entry:
    """What the warm child runs: a module (`-m`) or a script, with its arguments."""

    module: str | None
    script: str | None
    args: list[str]


def packages_stamp() -> str:
    """The interpreter's package folders as they are now (their mtimes change when a package is
    installed or removed)."""
    paths = sysconfig.get_paths()
    folders = sorted({paths["purelib"], paths["platlib"]})
    return ";".join(f"{p}:{os.stat(p).st_mtime_ns}" if os.path.isdir(p) else f"{p}:-" for p in folders)


def _interpreter(argv0: str, env: dict[str, str]) -> str:
    found = argv0 if os.sep in argv0 else shutil.which(argv0, path=env.get("PATH")) or argv0
    return os.path.abspath(found)


def entry_of(spec: LaunchSpec) -> Entry | str:
    """The module or script the attempt runs with this interpreter, or why it needs another process."""
    argv = spec.command
    if not argv:
        return "the attempt has no command"
    python = _interpreter(argv[0], spec.env)
    if venv_root(python) != venv_root(sys.executable):
        return (f"the attempt runs {argv[0]}, not the warm process's interpreter {sys.executable} "
                "(its own environment or runtime)")
    if len(argv) >= 3 and argv[1] == "-m":
        if argv[2] in TORCHRUN:
            return "a distributed group starts its workers under torchrun"
        return Entry(module=argv[2], script=None, args=argv[3:])
    if len(argv) >= 2 and not argv[1].startswith("-"):
        return Entry(module=None, script=argv[1], args=argv[2:])
    return f"the attempt's interpreter options {' '.join(argv[1:2])!r} need a new interpreter"


def refusal(spec: LaunchSpec, stamp: str, env_now: dict[str, str] | None = None,
            preloaded: frozenset[str] | None = None) -> Entry | str:
    """The Entry to run warm, or one line saying why this attempt starts cold. preloaded: set when the
    process loaded a run's recorded modules (glue.train.run.warm_follow), with the names read only at run
    time (the runs' secrets); every other variable the attempt sets must then be as they were loaded under,
    since a library may read it on import (HF_HUB_OFFLINE)."""
    entry = entry_of(spec)
    if isinstance(entry, str):
        return entry
    now = dict(os.environ) if env_now is None else env_now
    if preloaded is not None:
        for name, value in sorted(spec.env.items()):
            if name.startswith(GLUE_PREFIX) or name in IN_PROCESS or name in THREADS or name in preloaded:
                continue
            if now.get(name) != value:
                return (f"the attempt sets {name} otherwise than the environment the warm process loaded the "
                        "run's modules under")
    for name, value in sorted(spec.env.items()):
        if name in THREADS:
            continue
        if name.startswith(START_TIME_PREFIXES) and name not in IN_PROCESS and now.get(name) != value:
            return f"the attempt sets {name}, which only a new interpreter reads"
    counts = {spec.env[name] for name in THREADS if name in spec.env}
    if counts and (len(counts) > 1 or not all(c.isdigit() and int(c) > 0 for c in counts)):
        return f"the attempt's thread counts ({', '.join(f'{n}={spec.env[n]}' for n in THREADS if n in spec.env)}) " \
               "are not one positive number"
    if packages_stamp() != stamp:
        return "the trainer venv's packages changed after the warm process started"
    return entry

"""The modules a run's trainer had loaded after its first steps: the preload list of a spare's warm trainer
process for the run's environment (glue.train.run.warm), as a zygote preloads what its apps will load.

rank 0 writes it once per attempt into the run's records (layout.WARM_IMPORTS), from the heartbeat thread
once the first step was recorded (the forward, backward and update have imported what they import by
then). Only modules of the interpreter's own library and of installed packages are listed: the run's own
code (its workdir, the cwd) may do anything when imported and is never preloaded.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from typing import Any

from glue.train.errors import StorageError
from glue.train.layout import WARM_IMPORTS
from glue.train.storage.target import Storage
from glue.train.utc import iso, utc_now

MAX_MODULES = 20000  # a record stays a few hundred KiB whatever the job loads


def library_roots() -> tuple[str, ...]:
    """The folders whose modules are library code: the standard library and every site-packages on the
    path (a run's venv and, through its .pth, the image's)."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    roots |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def loaded() -> list[str]:
    """The library modules this interpreter has loaded, sorted (parents before their submodules)."""
    roots = library_roots()
    names = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name.startswith("__") or not isinstance(where, str):
            continue
        if os.path.realpath(where).startswith(roots):
            names.append(name)
    return sorted(names)[:MAX_MODULES]


def record() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "prefix": sys.prefix, "modules": loaded(),
            "recorded_at": iso(utc_now())}


def write(store: Storage) -> bool:
    """The record put into the run's records; False when the bucket did not take it (the next beat retries)."""
    try:
        store.put(WARM_IMPORTS, json.dumps(record()).encode())
    except StorageError:
        return False
    return True


def modules_of(doc: Any) -> list[str]:
    """The module names of a record as read back (a record of another shape: none)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("modules"), list):
        return []
    return [m for m in doc["modules"] if isinstance(m, str) and m and not m.startswith("__")]

"""What a warm trainer process (glue.train.run.warm) loads while it waits: the modules the runs it serves
recorded (glue.train.run.warm_imports), read from the bucket.

The follow file (JSON, written by glue.train.spare.arm, 0600 in the warm folder):
    {"bucket": {"name", "endpoint", "region"}, "credentials_file": ..., "runs": [<run>, ...],
     "env": {<a followed run's declared variables>}, "secrets": [<the runs' secret names>]}
It is read again at every refresh, so arming the spare again changes the runs without a new process.

A library may read a variable when it is imported (huggingface_hub reads HF_HUB_OFFLINE): before the first
recorded module is loaded, the run's declared variables are set in this process (those only an
interpreter's start reads excepted), and an attempt whose variables differ from them starts cold
(glue.train.run.warm_fit.refusal, told the secrets' names, which libraries read at run time).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from glue.train.errors import StorageError, TargetError
from glue.train.layout import WARM_IMPORTS, run_prefix
from glue.train.run.warm_fit import START_TIME_PREFIXES, THREADS
from glue.train.run.warm_imports import modules_of
from glue.train.storage.target import Storage, open_bucket


def load(names: Iterable[str]) -> tuple[int, list[str]]:
    """Import each module not yet loaded. Returns how many were loaded now and the names that failed."""
    loaded, failed = 0, []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a library's own code runs here; a failure only means not preloaded
            failed.append(name)
            continue
        loaded += 1
    return loaded, failed


class Follow:
    """The followed runs' records, each loaded once per recording."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seen: dict[str, str] = {}  # run -> recorded_at of the record loaded
        self._storage: Storage | None = None
        self._bucket: Any = None
        self._said = ""  # the last problem printed, said once
        self.env: dict[str, str] | None = None  # the declared variables set here before the first load
        self.secrets: frozenset[str] = frozenset()
        self.loaded = 0  # recorded modules loaded so far

    def preloaded(self) -> frozenset[str] | None:
        """For warm_fit.refusal: the names read at run time, once a recorded module was loaded (else None)."""
        return self.secrets if self.loaded else None

    def _apply_env(self, spec: dict[str, Any]) -> None:
        if self.env is not None:
            return  # modules may have read them already: never changed afterwards
        declared = spec.get("env")
        if not isinstance(declared, dict):
            declared = {}
        self.env = {str(k): str(v) for k, v in declared.items()
                    if not str(k).startswith(START_TIME_PREFIXES) or str(k) in THREADS}
        os.environ.update(self.env)

    def _spec(self) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("runs"), list) else None

    def _open(self, spec: dict[str, Any]) -> Storage:
        if self._storage is None or self._bucket != spec["bucket"]:
            self._storage, self._bucket = open_bucket(spec), spec["bucket"]
        return self._storage

    def refresh(self) -> int:
        """Load what the followed runs recorded since the last refresh. Returns the modules loaded now."""
        spec = self._spec()
        if spec is None:
            return 0
        self.secrets = frozenset(str(n) for n in spec.get("secrets") or [])
        try:
            storage = self._open(spec)
        except TargetError as exc:  # no credentials here (yet): nothing followed until the next refresh
            if self._said != str(exc):
                print(f"gpukit warm trainer: the followed runs' bucket: {exc}", flush=True)
                self._said = str(exc)
            return 0
        total = 0
        for run in (str(r) for r in spec["runs"]):
            try:
                data, _ = storage.get(f"{run_prefix(run)}{WARM_IMPORTS}")
                doc = json.loads(data)
            except (StorageError, TargetError, ValueError):
                continue  # not recorded yet (the run's first step is still to come), or unreadable
            stamp = str(doc.get("recorded_at")) if isinstance(doc, dict) else ""
            if self.seen.get(run) == stamp:
                continue
            self.seen[run] = stamp
            self._apply_env(spec)
            loaded, failed = load(modules_of(doc))
            total += loaded
            self.loaded += loaded
            print(f"gpukit warm trainer: run {run}: loaded {loaded} recorded modules"
                  + (f" ({len(failed)} could not be imported here, e.g. {failed[0]})" if failed else ""), flush=True)
        return total

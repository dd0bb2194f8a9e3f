"""One trial of a run's own command, ON the VM (the controller hands it a spec over SSH):

    python -m glue.memprobe.vm_trial SPEC.json      -> one JSON line: the trial's outcome

The spec (0600, on the VM's tmpfs; removed once read, as its environment may hold the run's secrets) holds
the command as the run's attempt would run it (prepared code and virtualenv), its environment with the probe
variables (glue.train.run.probe: the trainer stops itself after K steps and writes its measurements to the
probe folder), the memory limit (a memory cgroup, the same MemoryLimit the supervisor puts on a trainer) and
the time limit. The probe folder is removed afterwards, except what the controller fetches (a CUDA snapshot)
which is named in the outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from glue.memprobe.runner import run_command
from glue.train import trainer_vars as V


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    spec_path.unlink()  # it may hold the run's secrets: gone once read
    folder = Path(spec["probe_dir"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = {**os.environ, **spec["env"], V.PROBE_DIR: str(folder), V.PROBE_STEPS: str(spec["steps"]),
           V.PROBE_MODE: str(spec.get("mode") or "trial"), "PYTHONUNBUFFERED": "1"}
    out = run_command([str(a) for a in spec["argv"]], dict(spec.get("changed") or {}), env=env,
                      result_path=folder / "result.json", limit_mb=spec.get("limit_mb"),
                      mechanism=str(spec.get("mechanism") or "auto"), timeout_s=float(spec.get("timeout_s") or 600),
                      cwd=spec.get("cwd"))
    doc = out.as_dict()
    snapshot = folder / "snapshot.pickle"
    doc["snapshot_path"] = str(snapshot) if snapshot.is_file() else None
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Print the VM's training environment as JSON (run on the VM by `glue deploy` for the manifest).

torch is not imported: that costs seconds of CPU on every deploy, and the manifest needs only torch's version
and the CUDA it was built for (its own torch/version.py, read alone) and the GPUs the driver lists.
"""

from __future__ import annotations

import hashlib
import json
import platform
import runpy
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any


def torch_build() -> dict[str, Any]:
    """torch's version and CUDA build from its installed version.py; exits 1 in one line without torch."""
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        sys.exit("torch is not installed in the trainer runtime")
    found = runpy.run_path(str(dist.locate_file("torch/version.py")))
    return {"torch": found["__version__"], "cuda": found.get("cuda")}


def gpus_and_driver() -> tuple[list[str], str | None]:
    """The GPUs' names and the driver's version as nvidia-smi lists them; none without it."""
    if not shutil.which("nvidia-smi"):
        return [], None
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)
    rows = [[f.strip() for f in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return [], None
    return [r[0] for r in rows], rows[0][-1]


def collect() -> dict[str, object]:
    pkgs = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"])
    build = torch_build()
    gpus, driver = gpus_and_driver()
    return {
        "python": platform.python_version(),
        **build,
        "cuda_available": bool(build["cuda"]) and bool(gpus),  # a CUDA build and a GPU the driver sees
        "gpus": gpus,
        "driver": driver,
        "hostname": platform.node(),
        "kernel": platform.release(),
        "packages_sha256": hashlib.sha256("\n".join(pkgs).encode()).hexdigest(),
        "packages_count": len(pkgs),
        "executable": sys.executable,
    }


if __name__ == "__main__":
    print(json.dumps(collect()))

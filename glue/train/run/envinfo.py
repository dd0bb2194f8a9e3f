"""Print the VM's training environment as JSON (run on the VM by `glue deploy` for the manifest)."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
from importlib import metadata


def collect() -> dict[str, object]:
    import torch

    pkgs = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"])
    info: dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "driver": None,
        "hostname": platform.node(),
        "kernel": platform.release(),
        "packages_sha256": hashlib.sha256("\n".join(pkgs).encode()).hexdigest(),
        "packages_count": len(pkgs),
        "executable": sys.executable,
    }
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    return info


if __name__ == "__main__":
    print(json.dumps(collect()))

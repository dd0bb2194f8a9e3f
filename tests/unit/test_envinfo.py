"""The environment `glue deploy` records in the manifest, read on the VM without importing torch (seconds of
CPU on every deploy): torch's version and CUDA build from its own files, the GPUs and driver from nvidia-smi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = ("import json, sys; from glue.train.run import envinfo; "
          "print(json.dumps([envinfo.collect(), 'torch' in sys.modules]))")


def _collect(env: dict[str, str] | None = None) -> tuple[dict[str, object], bool]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    info, imported = json.loads(out.stdout)
    return info, imported


def test_torchs_build_is_read_without_importing_torch() -> None:
    info, imported = _collect()
    assert not imported
    assert (info["torch"], info["cuda"], info["python"]) == (torch.__version__, torch.version.cuda,
                                                             ".".join(map(str, sys.version_info[:3])))
    assert info["executable"] == sys.executable and int(str(info["packages_count"])) > 10


def test_gpus_and_the_driver_come_from_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 550.54.15'\necho 'NVIDIA H100 80GB HBM3, 550.54.15'\n")
    smi.chmod(0o755)
    info, _ = _collect({**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert info["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2 and info["driver"] == "550.54.15"
    # A CPU build of torch cannot use them.
    assert info["cuda_available"] is (torch.version.cuda is not None)

"""Empty stand-in wheels for the packages the VM's image already has, so that pip on the controller can
resolve the run's requirements "over" the image: a requirement on torch is met by the image's torch
(same name and version, no files), never by a download of a second one."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def write(folder: Path, packages: dict[str, str]) -> None:
    """One `<name>-<version>-py3-none-any.whl` per image package, metadata only."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in sorted(packages.items()):
        dist = _dist_name(name)
        info = f"{dist}-{version}.dist-info"
        files = {
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpukit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        files[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{info}/RECORD,,\n"
        with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
            for key, text in files.items():
                zf.writestr(key, text)

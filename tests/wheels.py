"""A small wheel built by hand in a test (no index, no build backend): `module` with `text` as its code."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str, version: str, module: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": text,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpukit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(body: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()

    files[f"{info}/RECORD"] = "".join(f"{k},sha256={digest(v)},{len(v.encode())}\n" for k, v in files.items()) \
        + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for key, body in files.items():
            zf.writestr(key, body)
    return path

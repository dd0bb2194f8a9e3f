"""Build the gpukit wheel into OUT: `python build_wheel.py OUT PROJECT KEY` (on the controller).

pip builds in the source tree (build/, *.egg-info), so two kit homes converging from one checkout at the same
moment take turns under a lock beside OUT; with a source KEY the second finds the wheel made and builds
nothing (without one, a playbook run by hand, it builds every time). The wheel is built aside and renamed into
place: a reader never sees half of one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(out: Path, project: str, key: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if key and any(out.glob("gpukit-*.whl")):
            return 0
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
        try:
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                                    "--no-build-isolation", "--disable-pip-version-check",
                                    "--wheel-dir", str(tmp), project], check=False)
            if built.returncode != 0:
                return built.returncode
            for wheel in tmp.glob("gpukit-*.whl"):
                os.replace(wheel, out / wheel.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))

"""The `glue` console script: what the controller needs, said in one line, before and around glue.cli.

The gpukit wheel installs on Python 3.10 (a VM's trainer runs there); the controller needs 3.11 and the
[controller] extra (`pip install 'gpukit[controller]'`). Without them `glue` says which is missing and
how to get it, with no traceback. This module runs on any Python the wheel installs on (3.10 included).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re
import sys

CONTROLLER_PYTHON = (3, 11)
INSTALL = "pip install 'gpukit[controller]' (or: pipx install 'gpukit[controller]')"


def missing_controller_packages() -> list[str]:
    """The [controller] extra's distributions that are not installed ([] when gpukit has no metadata)."""
    try:
        requires = metadata.requires("gpukit") or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for text in requires:
        if not re.search(r"""extra\s*==\s*["']controller["']""", text):
            continue
        found = re.match(r"[A-Za-z0-9._-]+", text.strip())
        if found is None:
            continue
        try:
            metadata.distribution(found.group(0))
        except metadata.PackageNotFoundError:
            missing.append(found.group(0))
    return missing


def main() -> None:
    if sys.version_info < CONTROLLER_PYTHON:
        have = ".".join(map(str, sys.version_info[:3]))
        sys.exit(f"glue: the controller needs Python >= 3.11 (this is {have} at {sys.executable}); install gpukit "
                 "with a newer Python, e.g. `pipx install --python python3.11 'gpukit[controller]'` (a VM's "
                 "trainer runs on 3.10 too)")
    try:
        # By name: the controller's code is checked as 3.11 (tests/lint_vm_python.py checks this module as 3.10)
        importlib.import_module("glue.cli").main()
    except ModuleNotFoundError as exc:
        if (exc.name or "glue").split(".")[0] == "glue":
            raise
        missing = missing_controller_packages()
        if missing:
            sys.exit(f"glue: the controller's packages {', '.join(missing)} are not installed (no module named "
                     f"{exc.name!r}); install them: {INSTALL}")
        sys.exit(f"glue: this command needs the module {exc.name!r}, which is not installed in {sys.prefix}: "
                 f"install its package there ({sys.executable} -m pip install ...)")


if __name__ == "__main__":
    main()

"""The gpukit wheel also carries what `glue` drives besides its Python code (all else is in pyproject.toml).

A controller installed with pip (`pip install 'gpukit[controller]'`, no checkout) needs the Ansible
playbooks and roles, the Terraform envs and module, and the VM image recipes: they go in as data files
under <prefix>/share/gpukit/ (glue.paths finds them there when glue does not run from a checkout), with
pyproject.toml and README.md, from which the trainer role builds the wheel a VM installs.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

KIT_DIRS = ("ansible", "terraform", "images")
KIT_FILES = ("pyproject.toml", "README.md")
# What terraform, Ansible or Python leave in those folders: state, caches, lock files. Never shipped.
SKIPPED_DIRS = {".terraform", "__pycache__", ".pytest_cache"}
SKIPPED_SUFFIXES = (".tfstate", ".tfstate.backup", ".lock.hcl", ".pyc", ".retry")


def kit_data_files() -> list[tuple[str, list[str]]]:
    here = Path(__file__).resolve().parent
    out: list[tuple[str, list[str]]] = [("share/gpukit", [name for name in KIT_FILES if (here / name).is_file()])]
    for top in KIT_DIRS:
        for folder, dirs, files in os.walk(here / top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            rel = Path(folder).relative_to(here)
            kept = sorted(str(rel / f) for f in files if not f.endswith(SKIPPED_SUFFIXES))
            if kept:
                out.append((f"share/gpukit/{rel.as_posix()}", kept))
    return out


# The trainer role's wheel for a VM (GPUKIT_WHEEL_FOR_VM=1): the code only; a VM drives nothing.
setup(data_files=[] if os.environ.get("GPUKIT_WHEEL_FOR_VM") == "1" else kit_data_files())

"""What wheels this VM can install (its Python, ABIs, platforms) and which packages its image already
has: the controller resolves the run's requirements for exactly this, with its own pip configuration."""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from typing import Any

from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.pins import as_dict, interpreter


def image_packages() -> dict[str, str]:
    """The image venv's own packages (torch, numpy, boto3 …): canonical name -> version."""
    dists = importlib.metadata.distributions(path=[sysconfig.get_paths()["purelib"]])
    return as_dict([f"{d.metadata['Name']}=={d.version}" for d in dists])


def target() -> dict[str, Any]:
    try:
        from pip._vendor.packaging import tags  # the image venv's pip: the tags it installs by
    except ImportError:
        raise WorkspaceError("the VM's trainer venv has no pip; re-run the playbook with `glue up`") from None
    sys_tags = list(tags.sys_tags())
    uniq = lambda xs: list(dict.fromkeys(xs))  # noqa: E731 - order kept: best first
    return {
        **interpreter(),
        "python_version": f"{sys.version_info.major}{sys.version_info.minor}",
        "implementation": sys.implementation.name[:2] if sys.implementation.name == "cpython" else "py",
        "abis": uniq(t.abi for t in sys_tags if t.abi not in ("none", "abi3")),
        "platforms": uniq(t.platform for t in sys_tags if t.platform != "any"),
        "image_packages": image_packages(),
    }

"""Before the first step every rank must agree on what it is about to train.

`agree()` all-gathers each rank's view (config hash, world size, code version, the user's code package
as verified on its node, restored checkpoint step) and raises `AgreementError` naming the first rank
and field that differ from rank 0, on every rank, so the whole group stops before one wrong rank can
poison the others' gradients.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from glue.train import trainer_vars

FIELDS = ("config_hash", "world_size", "code_version", "workdir_sha256", "restored_step")


class AgreementError(RuntimeError):
    """Ranks disagree on the workload (raised on every rank alike)."""


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_version() -> str:
    """Content hash of the code this process runs: the glue package and the launched script/module.

    Computed on the VM, so a node whose install is stale shows up as a different version.
    """
    import glue

    root = Path(glue.__file__).parent.resolve()
    files = sorted(root.rglob("*.py"))
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and not Path(main).resolve().is_relative_to(root):
        files.append(Path(main).resolve())  # a user's script outside the package
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def workdir_sha256() -> str | None:
    """The sha256 of the run's code package as `glue.train.workspace` verified it on this node (the
    record beside the unpacked code, GPUKIT_WORKDIR); None for a run without a workdir."""
    code = os.environ.get(trainer_vars.WORKDIR)
    if not code:
        return None
    try:
        return str(json.loads((Path(code).parent / "package.json").read_text())["sha256"])
    except (OSError, ValueError, KeyError):
        return "unreadable"  # differs from every real hash: this rank's code is not the verified one


def view(config: dict[str, Any], restored_step: int | None, world_size: int | None = None) -> dict[str, Any]:
    """This rank's view of the workload."""
    ws = world_size if world_size is not None else (dist.get_world_size() if dist.is_initialized() else 1)
    return {"config_hash": config_hash(config), "world_size": ws, "code_version": code_version(),
            "workdir_sha256": workdir_sha256(), "restored_step": restored_step}


def find_mismatch(views: list[dict[str, Any]]) -> str | None:
    """The first (rank, field) whose value differs from rank 0's, as a sentence; None when all agree."""
    ref = views[0]
    for rank, v in enumerate(views[1:], start=1):
        for name in FIELDS:
            if v.get(name) != ref.get(name):
                return f"rank {rank} has {name}={v.get(name)!r} but rank 0 has {ref.get(name)!r}"
    sizes = {v.get("world_size") for v in views}
    if sizes != {len(views)}:
        return f"every rank reports world_size {sizes.pop()!r} but {len(views)} ranks joined"
    return None


def agree(config: dict[str, Any], restored_step: int | None) -> dict[str, Any]:
    """All-gather the views; raise AgreementError on any difference. Returns this rank's view."""
    mine = view(config, restored_step)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    problem = find_mismatch(views)
    if problem:
        raise AgreementError(f"ranks disagree before training: {problem}; not training")
    return mine

"""A local VM's cgroups are removed children first, and a teardown racing another teardown of the same VM
(a watcher's read_vm finding the VM gone while a recovery or `glue down` deletes it) does not fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from glue.cloud.local import vm_cgroup


def _tree(top: Path) -> Path:
    for sub in ("system.slice/sshd.service", "system.slice/gpukit-mount.service", "gpukit/trainer"):
        (top / sub).mkdir(parents=True)
    return top


def test_a_vms_cgroup_tree_is_removed_children_first(tmp_path: Path) -> None:
    # Plain directories stand in for cgroupfs: rmdir of a non-empty one fails, as a cgroup's with children does.
    top = _tree(tmp_path / "gpukit-1-abc")
    vm_cgroup.remove([str(top), str(tmp_path / "never-made")])
    assert not top.exists()


def test_a_subtree_removed_by_another_teardown_meanwhile_is_skipped(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    top = _tree(tmp_path / "gpukit-1-abc")
    real_scandir = os.scandir

    def racing_scandir(path: str | os.PathLike[str]) -> object:
        if Path(path) == top / "system.slice":  # the other teardown got there first
            for gone in ("sshd.service", "gpukit-mount.service", ""):
                (top / "system.slice" / gone).rmdir()
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    vm_cgroup.remove([str(top)])
    assert not top.exists()

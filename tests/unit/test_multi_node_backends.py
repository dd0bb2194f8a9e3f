"""A multi-node run needs VMs that reach each other: on a backend whose VMs cannot (qemu's user-mode
networking; Lyceum, which does not network an account's VMs for one job on its public API) `glue deploy
--nodes N` refuses in one line before anything is looked up or started."""

from __future__ import annotations

from pathlib import Path

import pytest

from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.runs.vm_group import pick_hosts


@pytest.mark.parametrize(("backend", "why"), [("lyceum", "Lyceum does not network an account's VMs"),
                                              ("qemu", "qemu VMs cannot reach each other")])
def test_nodes_on_a_backend_without_vm_networking_is_one_line(tmp_path: Path, backend: str, why: str) -> None:
    ClusterConfig(backend=backend, vms=2).save(tmp_path)
    with pytest.raises(GlueError) as err:
        pick_hosts(tmp_path, None, 2)
    assert str(err.value).startswith(f"--nodes 2: {why}") and "--procs-per-node" in str(err.value)


def test_one_node_and_the_local_backend_are_not_refused(tmp_path: Path) -> None:
    ClusterConfig(backend="lyceum", vms=1).save(tmp_path)
    with pytest.raises(GlueError, match="no VMs in the cluster"):  # asked for one VM: only the cluster is empty
        pick_hosts(tmp_path, None, 1)
    ClusterConfig(backend="local", vms=2).save(tmp_path)
    with pytest.raises(GlueError, match="no VMs in the cluster"):
        pick_hosts(tmp_path, None, 2)

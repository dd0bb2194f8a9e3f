"""What glue reads from Slurm's clients on the head (glue.scheduler.slurm.nodes), on their real output shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.scheduler.slurm import nodes

SINFO = """gpukit-1|idle|gpu:1|none
gpukit-2|mixed|gpu:1|none
gpukit-2|mixed|gpu:1|none
gpukit-spare-1|drained|gpu:1|gpukit spare
gpukit-3|down*|gpu:1|Not responding
"""

GRES_USED = """gpukit-1            |mixed               |gpu:2               |gpu:1(IDX:0)        |
gpukit-2            |idle                |gpu:1               |gpu:0                |
gpukit-2            |idle                |gpu:1               |gpu:0                |
gpukit-spare-1      |drained             |gpu:1               |gpu:0                |
gpukit-3            |down*               |gpu:a100:1          |gpu:0                |
"""


def test_sinfo_lines_become_one_state_per_node() -> None:
    states = nodes.parse_sinfo(SINFO)
    assert [(n.name, n.state, n.gres, n.reason) for n in states] == [
        ("gpukit-1", "idle", "gpu:1", ""), ("gpukit-2", "mixed", "gpu:1", ""),
        ("gpukit-3", "down*", "gpu:1", "Not responding"), ("gpukit-spare-1", "drained", "gpu:1", "gpukit spare")]
    assert [n.name for n in states if n.in_service] == ["gpukit-1", "gpukit-2"]


def test_gpus_count_the_nodes_in_service_and_every_allocation() -> None:
    assert nodes.parse_gpus(GRES_USED) == (3, 1)


def test_a_cluster_without_slurm_has_no_head(tmp_path: Path) -> None:
    ClusterConfig(vms=2).save(tmp_path)
    with pytest.raises(GlueError, match="runs no scheduler"):
        nodes.head(tmp_path)


def test_a_node_name_that_is_not_one_is_refused_before_any_ssh(tmp_path: Path) -> None:
    ClusterConfig(vms=2, scheduler="slurm").save(tmp_path)
    with pytest.raises(GlueError, match="not a Slurm node name"):
        nodes.resume(tmp_path, "gpukit-1 state=down")

"""Placement without a scheduler (glue.runs.vm_group.choose): a run goes to a VM no live run uses; --vm
shares a busy one on purpose, and says so; when too few are free, one line names the busy VMs, their runs
and the ways out. The occupancy itself (which runs are live where) is read from the run records and the
monitor: tests/integration/test_placement.py."""

from __future__ import annotations

import pytest

from glue.errors import GlueError
from glue.infra.inventory import Host
from glue.runs.occupancy import Occupancy
from glue.runs.vm_group import choose


def _hosts(*names: str) -> list[Host]:
    return [Host(name=n, id=f"id-{n}", ssh_host="127.0.0.1", ssh_port=2200 + i, ssh_user="root", host_key="k",
                 gpu_type="none", gpu_count=0, backend="local") for i, n in enumerate(names)]


def test_a_run_goes_to_the_first_free_vm_in_name_order() -> None:
    hosts = _hosts("gpukit-10", "gpukit-2", "gpukit-1")
    assert [h.name for h in choose(hosts, Occupancy(), None, 1).hosts] == ["gpukit-1"]
    busy = Occupancy({"gpukit-1": ["a"]})
    placed = choose(hosts, busy, None, 1)
    assert [h.name for h in placed.hosts] == ["gpukit-2"] and placed.shared == ""
    assert [h.name for h in choose(hosts, busy, None, 2).hosts] == ["gpukit-2", "gpukit-10"]


def test_every_vm_busy_is_one_line_with_the_busy_vms_their_runs_and_the_fixes() -> None:
    hosts = _hosts("gpukit-1", "gpukit-2")
    with pytest.raises(GlueError) as err:
        choose(hosts, Occupancy({"gpukit-1": ["a"], "gpukit-2": ["b", "c"]}), None, 1)
    msg = str(err.value)
    assert msg.startswith("no free VM for this run, live runs use") and "\n" not in msg
    assert "gpukit-1 (run a), gpukit-2 (runs b, c)" in msg
    assert "--vm NAME" in msg and "glue up --vms 3" in msg and "glue stop --run" in msg


def test_a_group_needs_n_free_vms() -> None:
    hosts = _hosts("gpukit-1", "gpukit-2", "gpukit-3")
    with pytest.raises(GlueError) as err:
        choose(hosts, Occupancy({"gpukit-2": ["a"]}), None, 3)
    msg = str(err.value)
    assert msg.startswith("only 2 of the 3 free VMs this run needs") and "gpukit-2 (run a)" in msg
    assert "glue up --vms 4" in msg and "--vm NAME" not in msg  # a group cannot share by --vm


def test_vm_names_a_busy_vm_shares_it_and_says_with_whom() -> None:
    [vm] = _hosts("gpukit-1")
    placed = choose([vm], Occupancy({"gpukit-1": ["a"]}), "gpukit-1", 1)
    assert placed.hosts == [vm] and placed.shared == "gpukit-1 (run a)"
    assert choose([vm], Occupancy(), "gpukit-1", 1).shared == ""


def test_vm_names_as_many_distinct_vms_as_the_run_has_nodes() -> None:
    from glue.runs.vm_group import _named

    assert _named("gpukit-2,gpukit-1", 2) == ["gpukit-2", "gpukit-1"]  # node order as given
    for vm, nodes, says in (("gpukit-1", 2, "names its 2 distinct VMs, comma-separated"),
                            ("gpukit-1,gpukit-1", 2, "names its 2 distinct VMs"),
                            ("gpukit-1,gpukit-2", 1, "a single-node run names one VM; for a group add --nodes 2")):
        with pytest.raises(GlueError) as err:
            _named(vm, nodes)
        assert says in str(err.value) and "\n" not in str(err.value)

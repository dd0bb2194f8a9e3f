"""Which spare serves as which lost VM: the lookups every command makes before terraform's state says it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from glue.cluster import spare_roles
from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.infra.inventory import Host
from glue.infra.terraform import is_spare, vm_address

NODE = Host(name="gpukit-1", id="old", ssh_host="127.0.0.1", ssh_port=2201, ssh_user="root", host_key="ssh-ed25519 A",
            gpu_type="none", gpu_count=0, backend="local")
SPARE = replace(NODE, name="gpukit-spare-1", id="x", ssh_port=2202, host_key="ssh-ed25519 B")


def _take(home: Path, old_id: str | None = "old") -> None:
    with spare_roles.locked(home):
        spare_roles.add(home, [spare_roles.Taken(name="gpukit-1", spare="gpukit-spare-1", id="x", old_id=old_id,
                                                 run="r", at=spare_roles.now())])


def test_a_taken_spare_answers_to_the_lost_vms_name_with_its_own_address_and_key(tmp_path: Path) -> None:
    assert spare_roles.applied(tmp_path, [NODE, SPARE]) == [NODE, SPARE]  # nothing taken
    _take(tmp_path)
    [serving] = spare_roles.applied(tmp_path, [NODE, SPARE])
    assert serving == replace(SPARE, name="gpukit-1")  # the spare's address and pinned host key, the VM's name


def test_once_terraform_says_it_the_record_changes_nothing(tmp_path: Path) -> None:
    _take(tmp_path)
    renamed = replace(SPARE, name="gpukit-1")
    refilled = replace(SPARE, id="y")  # the refill's new spare
    assert spare_roles.applied(tmp_path, [renamed, refilled]) == [renamed, refilled]
    assert spare_roles.applied(tmp_path, [renamed]) == [renamed]  # the state moved, no new spare yet
    with spare_roles.locked(tmp_path):
        spare_roles.drop(tmp_path, {"gpukit-1"})
    assert spare_roles.taken(tmp_path) == []


def test_a_taken_spare_that_vanished_leaves_the_name_without_a_vm(tmp_path: Path) -> None:
    _take(tmp_path)
    assert spare_roles.applied(tmp_path, [NODE]) == []  # the next recovery provisions it


def test_a_damaged_record_is_one_line_never_ignored(tmp_path: Path) -> None:
    (tmp_path / "spares.json").write_text("{not json")
    with pytest.raises(GlueError, match=r"spares\.json cannot be read"):
        spare_roles.applied(tmp_path, [NODE])
    (tmp_path / "spares.json").write_text(json.dumps({"taken": [{"name": "gpukit-1"}]}))
    with pytest.raises(GlueError, match="is not a spare record"):
        spare_roles.taken(tmp_path)


def test_spare_names_and_addresses() -> None:
    cfg = ClusterConfig(vms=2, spares=2, name_prefix="team-a")
    assert cfg.spare_names() == ["team-a-spare-1", "team-a-spare-2"]
    assert [is_spare(n) for n in [*cfg.vm_names(), *cfg.spare_names()]] == [False, False, True, True]
    assert not is_spare("spare-1") and not is_spare("a-spare-x")
    assert vm_address("team-a-spare-2") == 'module.cluster.gpukit_vm.spare["team-a-spare-2"]'
    assert vm_address("team-a-1") == 'module.cluster.gpukit_vm.node["team-a-1"]'


@pytest.mark.parametrize("spares", [-1, 9, "2", 1.5])
def test_a_cluster_config_with_bad_spares_is_refused(tmp_path: Path, spares: object) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"backend": "local", "vms": 2, "spares": spares}))
    with pytest.raises(GlueError, match="is not a cluster config"):
        ClusterConfig.load(tmp_path)

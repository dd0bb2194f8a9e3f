"""The ssh backend's pool of hosts, without a login: which host a VM takes, a host that stops answering is
lost (out of the cluster, kept out of the pool, its leftovers to be released, never dropped from the file),
and no free host is NoCapacity (what `glue watch` waits on)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from glue.cloud.base import VMSpec, relabel
from glue.cloud.ssh import hosts, state
from glue.cloud.ssh.backend import SshBackend
from glue.errors import NoCapacity

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0a3J1bm5pbmcgb3V0IG9mIGtleXMgaGVyZQ"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def _backend(tmp_path: Path, n: int = 3) -> SshBackend:
    text = "hosts:\n" + "".join(f"  - name: box-{i}\n    address: 127.0.0.1\n    port: {_closed_port()}\n"
                                f"    identity_file: {tmp_path / 'id'}\n" for i in range(1, n + 1))
    hosts.write_snapshot(tmp_path, hosts.parse(text, "hosts.yaml"))
    with state.changing(tmp_path) as st:
        st.pins = {f"box-{i}": KEY for i in range(1, n + 1)}
    return SshBackend(tmp_path)


def test_a_vm_takes_its_own_host_then_the_one_released_longest_ago(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    picked = backend._reserve("gpukit-2")
    assert picked is not None and picked[0].id == "box-2" and picked[1] == KEY
    assert backend.owned_vm_ids() == ["box-2"]
    with state.changing(tmp_path) as st:
        st.released_at["box-1"] = 100.0  # released a moment ago: box-3, never taken, goes first
    picked = backend._reserve("gpukit-1")
    assert picked is not None and picked[0].id == "box-3"


def test_a_host_that_stops_answering_is_lost_and_kept_out(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    with state.changing(tmp_path) as st:
        st.taken = {"box-1": "gpukit-1", "box-2": "gpukit-2"}
    assert backend.read_vm("box-2") is None  # nothing listens on its port: gone for terraform
    st = state.read(tmp_path)
    assert "box-2" in st.lost and "unreachable" in st.lost["box-2"] and st.dirty == ["box-2"]
    assert st.taken == {"box-1": "gpukit-1"} and "box-2" in {h.id for h in hosts.read_snapshot(tmp_path)}
    backend.delete_vm("box-2")  # terraform's destroy of a lost host: nothing to reach, nothing raised
    picked = backend._reserve("gpukit-2")  # the replacement skips the lost host
    assert picked is not None and picked[0].id == "box-3"
    with pytest.raises(NoCapacity, match=r"no capacity: no free host in the hosts file for gpukit-3 \(2 taken, "
                                         r"1 lost\)"):
        backend.create_vm(VMSpec("gpukit-3", "none", 0, 10, KEY))


def test_warm_spares_take_the_files_last_hosts_and_a_rename_in_place_relabels_the_host(tmp_path: Path) -> None:
    """VMs and spares created together (terraform, in any order) land where the file's order says: the
    cluster's VMs on its first hosts, the spares on its last; a spare renamed in place serves as its new name."""
    backend = _backend(tmp_path, n=4)
    picked = [backend._reserve(n) for n in ("gpukit-spare-1", "gpukit-1", "gpukit-spare-2", "gpukit-2")]
    assert [p[0].id if p else None for p in picked] == ["box-4", "box-1", "box-3", "box-2"]
    assert state.read(tmp_path).taken["box-4"] == "gpukit-spare-1"
    relabel(backend, "box-4", "gpukit-2")  # as the provider's update does when the spare took gpukit-2's place
    assert state.read(tmp_path).taken["box-4"] == "gpukit-2"
    relabel(backend, "box-9", "gpukit-3")  # a host the cluster does not hold is not taken by a label
    assert "box-9" not in state.read(tmp_path).taken

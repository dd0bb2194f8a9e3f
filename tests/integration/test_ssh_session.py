"""One SSH connection per host within a session (a monitor poll), a fresh one per command outside."""

from __future__ import annotations

import time

import pytest

from glue.cluster import current
from glue.infra import ssh
from tests.kit import Kit

pytestmark = pytest.mark.integration

# The shell's parent is the sshd process serving the connection: equal parents = one connection.
PARENT = "ps -o ppid= -p $$"


def _parents(kit: Kit, n: int) -> list[str]:
    host = current.hosts(kit.home)[0]
    return [ssh.run(kit.home, host, PARENT).stdout.strip() for _ in range(n)]


def test_commands_in_a_session_share_one_connection(cluster_kit: Kit) -> None:
    with ssh.session():
        inside = _parents(cluster_kit, 3)
        host = current.hosts(cluster_kit.home)[0]
        ssh.put_file(cluster_kit.home, host, "/tmp/gpukit-session-probe", b"x")
        assert ssh.reachable(cluster_kit.home, host)
        inside += _parents(cluster_kit, 1)
        assert ssh.opened_in_session() == 1
    outside = _parents(cluster_kit, 3)
    assert len(set(inside)) == 1, inside
    assert len(set(outside)) == 3, outside
    assert ssh.opened_in_session() == 0


def test_a_connection_that_died_is_replaced_within_the_session(cluster_kit: Kit) -> None:
    host = current.hosts(cluster_kit.home)[0]
    with ssh.session():
        first = ssh.run(cluster_kit.home, host, PARENT).stdout.strip()
        # Kill this connection's sshd from inside it: the next command must reconnect, not fail.
        ssh.run(cluster_kit.home, host, f"(sleep 0.2; kill {first}) >/dev/null 2>&1 &")
        time.sleep(1.0)
        second = ssh.run(cluster_kit.home, host, PARENT).stdout.strip()
    assert second and second != first


def test_put_file_replaces_a_file_whole_for_a_reader_rereading_it(cluster_kit: Kit) -> None:
    """The trainer rereads its credentials file on every refresh: a push must swap in a complete new
    file (a rename), never truncate the one being read; the new file is 0600 and nothing is left over."""
    host = current.hosts(cluster_kit.home)[0]
    path = "/tmp/gpukit-put-probe/credentials.json"
    ssh.put_file(cluster_kit.home, host, path, b'{"old":1}')
    before = ssh.run(cluster_kit.home, host, f"stat -c %i {path}").stdout.strip()
    ssh.put_file(cluster_kit.home, host, path, b'{"new":2}')
    after = ssh.run(cluster_kit.home, host, f"stat -c '%i %a' {path}; cat {path}; echo; ls -a /tmp/gpukit-put-probe")
    inode, mode, content, *listing = after.stdout.split()
    assert inode != before, "the file was rewritten in place: a reader could see it empty"
    assert (mode, content) == ("600", '{"new":2}'), after.stdout
    assert sorted(listing) == [".", "..", "credentials.json"], listing

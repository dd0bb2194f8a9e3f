"""The ssh backend's hosts file: what a user writes is read as they meant it, and every bad entry is one line
that names the host and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from glue.cloud.ssh import hosts
from glue.errors import GlueError

GOOD = """
hosts:
  - address: 10.0.0.5
    user: ubuntu
    identity_file: ~/.ssh/id_ed25519
    labels: {gpu_type: h100, gpu_count: 8}
  - name: box-b
    address: gpu-b.example.org
    port: 2222
    identity_file: /keys/b
    proxy_jump: bastion
"""


def test_a_hosts_file_reads_as_written() -> None:
    a, b = hosts.parse(GOOD, "hosts.yaml")
    assert (a.id, a.address, a.port, a.user, a.labels.gpu_type, a.labels.gpu_count) == \
        ("10.0.0.5", "10.0.0.5", 22, "ubuntu", "h100", 8)
    assert a.identity_path() == Path("~/.ssh/id_ed25519").expanduser()
    assert (b.id, b.port, b.user, b.proxy_jump, b.labels.gpu_count) == ("box-b", 2222, "root", "bastion", None)
    assert b.where == "root@gpu-b.example.org:2222"
    # the jump: the host's user and identity file, port 22, unless it says otherwise
    assert b.jump_id == "jump root@bastion:22" and a.jump_id is None and a.jump() is None
    jump = b.jump("ssh-ed25519 AAAA")
    assert jump is not None and (jump.user, jump.address, jump.port, jump.identity_file, jump.host_key) == \
        ("root", "bastion", 22, "/keys/b", "ssh-ed25519 AAAA")
    other = hosts.parse("hosts:\n  - address: a\n    user: ubuntu\n    identity_file: k\n"
                        "    proxy_jump: admin@10.0.0.1:2200\n", "h")[0].jump()
    assert other is not None and other.where == "admin@10.0.0.1:2200" and other.known_hosts_name == "[10.0.0.1]:2200"


@pytest.mark.parametrize(("text", "said"), [
    ("hosts:\n  - address: a\n    identity_file: k\n    prot: 22\n",
     "host 1 (a): prot: Extra inputs are not permitted"),
    ("hosts:\n  - address: a\n    identity_file: k\n  - address: b\n    port: 70000\n    identity_file: k\n",
     "host 2 (b): port: Input should be less than or equal to 65535"),
    ("hosts:\n  - address: a\n", "host 1 (a): identity_file: Field required"),
    ("hosts:\n  - address: a\n    identity_file: k\n    labels: {gpu_count: -1}\n",
     "host 1 (a): labels.gpu_count: Input should be greater than or equal to 0"),
    ("hosts: []\n", "hosts: List should have at least 1 item"),
    ("hosts:\n  - address: a\n    identity_file: k\n  - address: a\n    identity_file: k\n",
     "host 2 has the same name as host 1 ('a')"),
    ("hosts:\n  - address: a\n    address: b\n", "not valid YAML at line 3"),
    ("hosts:\n  - address: a b\n    identity_file: k\n", "host 1 (a b): address: String should match pattern"),
    ("hosts:\n  - address: a\n    identity_file: k\n    proxy_jump: u@b:99999\n",
     "host 1 (a): proxy_jump: Value error, use [user@]host[:port], as `ssh -J` takes it (one jump)"),
    ("hosts:\n  - address: a\n    identity_file: k\n    proxy_jump: j1,j2\n",
     "host 1 (a): proxy_jump: Value error, use [user@]host[:port]"),
])
def test_a_bad_entry_is_one_line_naming_it(text: str, said: str) -> None:
    with pytest.raises(GlueError) as err:
        hosts.parse(text, "hosts.yaml")
    msg = str(err.value)
    assert said in msg and "\n" not in msg and msg.startswith("hosts file hosts.yaml: ")


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GlueError, match=r"hosts file .*nope.yaml: cannot be read .*--hosts"):
        hosts.load(tmp_path / "nope.yaml")


def test_the_snapshot_round_trips(tmp_path: Path) -> None:
    entries = hosts.parse(GOOD, "hosts.yaml")
    assert hosts.read_snapshot(tmp_path) == []
    hosts.write_snapshot(tmp_path, entries)
    assert hosts.read_snapshot(tmp_path) == entries

"""A 2-node torchrun group started with the exact commands glue runs on its VMs (here both "nodes" on
this host, the group's address loopback): while the workers are joined, every socket any process of
the group listens on is bound to the group's address, none to all interfaces. torch's own stores
would listen on 0.0.0.0/:: (torchrun's rendezvous host and each round's rank-0 worker store)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from glue.runs.vm_group import GroupSpec
from glue.train.run.torchrun import Rendezvous, node_env, torchrun_argv

WORKER = """
import sys, time, pathlib
import torch, torch.distributed as dist
from glue.train.run import process_group
gen = process_group.join()
out = pathlib.Path(sys.argv[1])
(out / f"ready-{dist.get_rank()}").write_text(str(gen))
deadline = time.monotonic() + 150  # never outlive the test, whatever happens to it
while not (out / "go").exists():
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.1)
t = torch.ones(1)
dist.all_reduce(t)
(out / f"sum-{dist.get_rank()}").write_text(str(int(t.item())))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(roots: list[int]) -> set[int]:
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = set(roots), list(roots)
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in found]
        found.update(kids)
        todo.extend(kids)
    return found


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket held by one of pids (from /proc/net/tcp{,6})."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                addr = socket.inet_ntop(socket.AF_INET6, raw)
            else:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            out.append((addr, int(hexport, 16), inodes[f[9]]))
    return out


@pytest.mark.timeout(240)
def test_every_socket_of_a_group_listens_on_the_group_address_only(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    port = _free_port()
    spec = GroupSpec(nodes=2, procs_per_node=1, rdzv_timeout_s=120)
    rdzv = Rendezvous("127.0.0.1", port, ("127.0.0.1", "127.0.0.1"), ("lo", "lo"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in (0, 1):
            argv = torchrun_argv(sys.executable, [sys.executable, str(script), str(tmp_path)], spec, rdzv, node, "t", 1)
            env = {**os.environ, **node_env(rdzv, node), "GPUKIT_DIST_TIMEOUT_S": "120"}
            log = open(tmp_path / f"node{node}.log", "wb")  # the child holds it; ours closes with the test
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 180
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                logs = "\n".join((tmp_path / f"node{n}.log").read_text()[-2000:] for n in (0, 1))
                pytest.fail(f"the group never joined:\n{logs}")
            time.sleep(0.2)
        sockets = _listening(_descendants([p.pid for p in procs]))
        ports = {p for _, p, _ in sockets}
        assert port in ports, f"no process of the group serves the rendezvous store: {sockets}"
        assert len(ports) >= 3, f"expected the rendezvous store, the worker store and gloo's: {sockets}"
        wide = [s for s in sockets if s[0] != "127.0.0.1"]
        assert not wide, f"listening beyond the group's address: {wide}"
        (tmp_path / "go").write_text("")
        for p in procs:
            assert p.wait(120) == 0, (tmp_path / f"node{procs.index(p)}.log").read_text()[-3000:]
        assert [(tmp_path / f"sum-{r}").read_text() for r in (0, 1)] == ["2", "2"]
    finally:
        # torchrun starts its workers in sessions of their own: kill the whole tree, not the groups
        for pid in _descendants([p.pid for p in procs if p.poll() is None]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(10)

"""The group's store ports come from below the kernel's ephemeral range, where no outgoing connection or
port-0 bind can take them between the pick and rank 0's bind (the two-node "Address already in use")."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from glue.train.run.ports import below_ephemeral

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_a_port_below_the_ephemeral_range_that_nothing_holds(tmp_path: Path) -> None:
    low = int(RANGE.read_text().split()[0])
    for _ in range(20):
        port = below_ephemeral("127.0.0.1")
        assert low // 2 <= port < low
        socket.create_server(("127.0.0.1", port)).close()  # what bound_store does with it
    tiny = tmp_path / "range"
    tiny.write_text("4\t60999\n")  # below it: ports 2 and 3 only
    with socket.create_server(("127.0.0.1", 2)):
        assert {below_ephemeral("127.0.0.1", str(tiny)) for _ in range(10)} == {3}
        with socket.create_server(("127.0.0.1", 3)):  # every draw held: the kernel's pick, not a failure
            assert below_ephemeral("127.0.0.1", str(tiny)) >= 1024


def test_every_torchrun_agent_gives_its_workers_a_store_port_below_the_range(tmp_path: Path) -> None:
    low = int(RANGE.read_text().split()[0])
    script = tmp_path / "worker.py"
    script.write_text("import os\nprint('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\n")
    rdzv = below_ephemeral("127.0.0.1")
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # as node_env: each round's own store
    proc = subprocess.run(
        [sys.executable, "-m", "glue.train.run.process_group", f"--host-store=127.0.0.1:{rdzv}", "--",
         "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv}",
         "--rdzv-conf=is_host=0", "--local-addr=127.0.0.1", "--monitor-interval=1", str(script)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    port = int(next(ln.split()[-1] for ln in proc.stdout.splitlines() if "MASTER_PORT" in ln))
    assert low // 2 <= port < low and port != rdzv

"""A worker's place in a torchrun group: join the process group, learn the group's restart generation;
and the group's stores, listening on the group's address only.

torchrun's TORCHELASTIC_RESTART_COUNT is per node: the node whose worker failed counts a restart,
a node restarted only because the group's membership changed does not. Deciding "resume or not"
from it would let one node start fresh while another restores (and their collectives cross). The
generation is the sum of the nodes' counts: every restart round raises it on every rank alike.

torch's TCPStore, unauthenticated, listens on every interface of the host that serves it. Both
stores of a group are therefore served here from a socket bound to the group's address (loopback
on the local backend): torchrun's rendezvous store by `python -m glue.train.run.process_group
--host-store ADDR:PORT -- <torchrun args>` on the head (every torchrun agent, the head's too, is a
client: rdzv-conf is_host=0), and each round's worker store by rank 0 in join().
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def under_torchrun(env: dict[str, str]) -> bool:
    return int(env.get("WORLD_SIZE", "1")) > 1 and "TORCHELASTIC_RUN_ID" in env


def bound_store(
    addr: str, port: int, world_size: int | None, timeout: timedelta, *, wait_for_workers: bool = True
) -> dist.TCPStore:
    """A TCPStore server listening on addr:port only (TCPStore's own socket would listen on all)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.create_server((addr, port), family=family, backlog=1024)  # SO_REUSEADDR, as TCPStore's
    # The store owns the listening socket from here on, for the life of the process.
    return dist.TCPStore(
        addr,
        port,
        world_size,
        True,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        master_listen_fd=sock.detach(),
    )


def _worker_store(env: dict[str, str], timeout: timedelta) -> tuple[dist.Store, int, int] | None:
    """This round's store, as env:// would make it but served bound to MASTER_ADDR; None where torchrun
    shares its own store with the workers (then it is the rendezvous store, already bound)."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return None
    try:
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None  # not a torchrun worker's environment: init_process_group reports what is missing
    if rank == 0:
        return bound_store(addr, port, world_size, timeout), rank, world_size
    return dist.TCPStore(addr, port, world_size, False, timeout=timeout), rank, world_size


def join(env: dict[str, str] | None = None, timeout_s: float | None = None) -> int:
    """Initialise the default process group (unless the trainer already did) and return the generation.

    Backend: gloo for CPU tensors, plus nccl for CUDA tensors when a GPU is visible.
    """
    env = dict(os.environ) if env is None else env
    if not dist.is_initialized():
        timeout = timedelta(seconds=float(timeout_s or env.get("GPUKIT_DIST_TIMEOUT_S", "300")))
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
            backend = "cpu:gloo,cuda:nccl"
        store = _worker_store(env, timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=store[0], rank=store[1], world_size=store[2], timeout=timeout)
    mine = int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) if int(env.get("LOCAL_RANK", "0")) == 0 else 0
    total = torch.tensor([mine], dtype=torch.int64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return int(total.item())


def agent(argv: list[str]) -> None:
    """`[--host-store=ADDR:PORT] -- <torchrun args>`: run torchrun's agent in this process, its worker-store
    ports picked below the ephemeral range (glue.train.run.ports: a port-0 pick is taken by the next
    outgoing connection before rank 0 binds it), and with --host-store (the head) serve the rendezvous
    store bound to ADDR:PORT, living exactly as long as the agent (across its restart rounds); signals
    reach the agent as before."""
    host = argv[0].split("=", 1)[1] if argv and argv[0].startswith("--host-store=") else None
    rest = argv[1:] if host is not None else argv
    if not rest or rest[0] != "--":
        raise SystemExit("usage: python -m glue.train.run.process_group [--host-store=ADDR:PORT] -- <torchrun args>")
    from torch.distributed.elastic.rendezvous import api as rendezvous_api
    from torch.distributed.run import main as torchrun

    from glue.train.run.ports import below_ephemeral

    rendezvous_api.get_free_port = below_ephemeral  # what RendezvousStoreInfo.build calls
    store = None
    if host is not None:
        addr, _, port = host.rpartition(":")
        store = bound_store(addr.strip("[]"), int(port), None, timedelta(seconds=60), wait_for_workers=False)
    try:
        torchrun(rest[1:])
    finally:
        del store


if __name__ == "__main__":
    agent(sys.argv[1:])

"""A worker's place in a torchrun group: join the process group, learn the group's restart generation.

torchrun's TORCHELASTIC_RESTART_COUNT is per node: the node whose worker failed counts a restart,
a node restarted only because the group's membership changed does not. Deciding "resume or not"
from it would let one node start fresh while another restores (and their collectives cross). The
generation is the sum of the nodes' counts: every restart round raises it on every rank alike.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def under_torchrun(env: dict[str, str]) -> bool:
    return int(env.get("WORLD_SIZE", "1")) > 1 and "TORCHELASTIC_RUN_ID" in env


def join(env: dict[str, str] | None = None, timeout_s: float | None = None) -> int:
    """Initialise the default process group (unless the trainer already did) and return the generation.

    Backend: gloo for CPU tensors, plus nccl for CUDA tensors when a GPU is visible.
    """
    env = dict(os.environ) if env is None else env
    if not dist.is_initialized():
        timeout = timedelta(seconds=float(timeout_s or env.get("GPUKIT_DIST_TIMEOUT_S", "300")))
        if torch.cuda.is_available():
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
            dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
    mine = int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) if int(env.get("LOCAL_RANK", "0")) == 0 else 0
    total = torch.tensor([mine], dtype=torch.int64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return int(total.item())

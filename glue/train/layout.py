"""Names of a run's objects under runs/<run>/ in the bucket: written on the VM, read by the controller.

Light on purpose (no torch): the controller imports it too. Layout: docs/design.md, section 4 "Bucket layout".
"""

from __future__ import annotations


def heartbeat_key(rank: int) -> str:
    return "heartbeat.json" if rank == 0 else f"heartbeat.rank{rank}.json"


def metrics_key(attempt: int, rank: int, restart: int, part: int, suffix: str = "") -> str:
    """Sorted by name = written in order: attempt, then torchrun restart, then part."""
    again = f"x{restart:02d}-" if restart else ""
    return f"metrics/{attempt:03d}-r{rank}-{again}{part:05d}{suffix}.jsonl"


def error_key(attempt: int, rank: int, restart: int) -> str:
    """One error file per rank and torchrun restart (a restart must not overwrite the first error)."""
    return f"attempts/{attempt}.error.rank{rank}" + (f".x{restart:02d}" if restart else "") + ".json"


def exit_key(attempt: int, node: int) -> str:
    """The supervisor's exit record; node 0 (and a single-node run) keeps the plain name."""
    return f"attempts/{attempt}.exit.json" if node == 0 else f"attempts/{attempt}.exit.node{node}.json"


def log_prefix(attempt: int, node: int) -> str:
    return f"logs/{attempt:03d}-" + (f"n{node}-" if node else "")


ATTEMPTS_PREFIX = "attempts/"


def errors_prefix(attempt: int) -> str:
    """Every rank's and restart round's error file of an attempt (error_key) starts so."""
    return f"attempts/{attempt}.error"


def notices_prefix(attempt: int) -> str:
    """Every rank's termination-notice record of an attempt (notice_key) starts so."""
    return f"attempts/{attempt}.notice."


def notice_key(attempt: int, rank: int) -> str:
    """What rank `rank` did on a termination notice: checkpointed at a step, exited PREEMPTED_EXIT."""
    return f"{notices_prefix(attempt)}rank{rank}.json"


def attempt_key(attempt: int) -> str:
    """The attempt record `glue deploy` / recovery write for attempt n (before its trainer starts)."""
    return f"attempts/{attempt}.json"


def attempt_of(key: str) -> int | None:
    """n for `attempts/<n>.json` (an attempt record); None for any other key (error, exit records)."""
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None

"""What restore does with checkpoints it cannot use.

An interrupted save (no COMMIT.json: the process died while saving) is routine and recorded as
`ckpt_interrupted`; prune removes its leftovers later. A committed checkpoint that fails validation
is corruption: recorded as `ckpt_corrupt` and moved aside to `ckpt-invalid/<ts>/step-<N>/` so that
neither prune nor a later save of the same step destroys the evidence.
"""

from __future__ import annotations

import json
import logging
import os
import socket

from glue.train.checkpoint.format import CheckpointStatus, record_incident
from glue.train.errors import NoValidCheckpointError, StorageError
from glue.train.layout import COMMIT, REJECTED, commit_key, incident_key, invalid_step_prefix, key_stamp, step_prefix
from glue.train.storage.target import Storage
from glue.train.utc import iso, utc_now

log = logging.getLogger("glue.train")


def interrupted(listing: dict[str, int]) -> bool:
    return COMMIT not in listing


def corrupt(listing: dict[str, int]) -> bool:
    """Committed, and not rejected by glue: a checkpoint that was good and has gone bad."""
    return COMMIT in listing and REJECTED not in listing


def no_valid_error(where: str, skipped: list[CheckpointStatus]) -> NoValidCheckpointError:
    why = "; ".join(
        f"step {s.step}: {s.problems[0].what if s.problems else 'invalid'}" for s in skipped
    )
    return NoValidCheckpointError(
        f"no valid checkpoint in {where} ({why}); nothing was deleted."
        " Inspect them, or call restore(start_fresh=True) to move them aside and start from step 0"
    )


def move_aside(st: Storage, step: int, listing: dict[str, int], stamp: str) -> str:
    """Copy the step's objects to ckpt-invalid/<stamp>/step-<N>/, then delete them (COMMIT.json first)."""
    src = step_prefix(step)
    dst = invalid_step_prefix(stamp, step)
    for key in sorted(listing):
        data, _ = st.get(src + key, listing[key])
        st.put(dst + key, data)
    if COMMIT in listing:
        st.delete([src + COMMIT])
    st.delete([src + k for k in listing if k != COMMIT])
    return dst


def record_skipped(
    st: Storage,
    skipped: list[CheckpointStatus],
    listings: dict[int, dict[str, int]],
    fell_back_to: int | None,
    rank: int,
    *,
    move: bool,
) -> None:
    """One incident per skipped step (rank 0 only); with move=True corrupt ones are moved aside."""
    if rank != 0:
        return
    stamp = utc_now().strftime("%Y%m%dT%H%M%S.%fZ")  # one folder per restore
    for status in skipped:
        try:
            if interrupted(listings[status.step]):
                key = _record_interrupted(st, status, listings[status.step], fell_back_to, rank)
            else:
                key = record_incident(st, status, fell_back_to, rank, st.describe())
                if move:
                    log.warning("corrupt checkpoint step %d moved to %s", status.step,
                                move_aside(st, status.step, listings[status.step], stamp))
            log.warning("incident recorded: %s", key)
        except StorageError as exc:
            log.error("could not record or move aside checkpoint step %d: %s", status.step, exc)


def _record_interrupted(
    st: Storage, status: CheckpointStatus, listing: dict[str, int], fell_back_to: int | None, rank: int
) -> str:
    now = utc_now()
    body = {
        "class": "ckpt_interrupted",
        "at": iso(now),
        "target": st.describe(),
        "step": status.step,
        "object": commit_key(status.step),
        "what": "COMMIT.json is missing: the save was interrupted (process killed or VM lost mid-save)",
        "objects": sorted(step_prefix(status.step) + k for k in listing),
        "fell_back_to": fell_back_to,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    key = incident_key(key_stamp(iso(now)), "ckpt_interrupted")
    st.put(key, (json.dumps(body, indent=1) + "\n").encode())
    return key

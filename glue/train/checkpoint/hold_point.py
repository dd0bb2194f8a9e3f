"""A test hook: hold a save at a named point of the commit protocol, so that a test can kill -9 the
process exactly inside that window (tests/integration/test_ckpt_kill.py) instead of at a random time.

Armed only by a call to `arm` (no environment variable: production code never reaches it by accident);
unarmed, `reached` is one comparison. Points, in protocol order:
  upload     the first object of the step is in the target, the others are not yet
  verify     every object is uploaded; the read-back has not started
  commit     every object is verified; COMMIT.json is about to be written
  committed  COMMIT.json is written; its read-back (and the prune after it) has not run
  prune      an older step's COMMIT.json is deleted, its objects are not yet
"""

from __future__ import annotations

import os
import time

POINTS = ("upload", "verify", "commit", "committed", "prune")
_armed: tuple[str, int, str] | None = None


def arm(point: str, step: int, marker: str) -> None:
    """Hold the save of `step` at `point` for good, after writing `point` to the file `marker`."""
    global _armed
    if point not in POINTS:
        raise ValueError(f"unknown hold point {point!r}; one of {', '.join(POINTS)}")
    _armed = (point, step, marker)


def armed_at(point: str, step: int) -> bool:
    return _armed is not None and _armed[:2] == (point, step)


def reached(point: str, step: int) -> None:
    if not armed_at(point, step):
        return
    assert _armed is not None
    with open(_armed[2], "w") as f:
        f.write(point)
        f.flush()
        os.fsync(f.fileno())
    while True:  # until the test's kill -9
        time.sleep(3600)

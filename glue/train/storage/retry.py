"""Retrying transient storage failures: exponential backoff with jitter, bounded by attempts and by time.

Storage backends decide what is transient (they raise `Transient`); permanent failures (a missing
bucket, rejected credentials) are raised at once and never reach the retry loop.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from glue.train.errors import StorageError

log = logging.getLogger("glue.train")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and by total time."""

    attempts: int = 10
    base_s: float = 0.5
    max_s: float = 15.0
    deadline_s: float = 300.0


class Transient(Exception):
    """A failure worth retrying; carries a one-line description."""


# Backoff jitter must not draw from the global `random` stream: the training loop owns that one,
# and a draw from this thread would make the run differ from an uninterrupted one.
_jitter = random.Random()


def with_retry(what: str, op: Callable[[], T], policy: RetryPolicy) -> T:
    """Run op; on Transient, back off and retry until the policy runs out, then StorageError."""
    start = time.monotonic()
    delay = policy.base_s
    for attempt in range(1, policy.attempts + 1):
        try:
            return op()
        except Transient as exc:
            elapsed = time.monotonic() - start
            if attempt == policy.attempts or elapsed + delay > policy.deadline_s:
                raise StorageError(f"{what} failed after {attempt} attempts over {elapsed:.1f}s: {exc}") from exc
            log.warning("%s failed (attempt %d/%d), retrying in %.1fs: %s", what, attempt, policy.attempts, delay, exc)
            time.sleep(delay * (0.5 + _jitter.random() / 2))
            delay = min(delay * 2, policy.max_s)
    raise AssertionError("unreachable")

"""Fencing: a trainer whose attempt was replaced never commits a checkpoint again.

Recovery writes `attempts/<m>.json` for the new attempt before starting it. A trainer of an older
attempt that is still alive (a paused VM, a partitioned network) would otherwise keep committing
into the same checkpoint directory as its replacement. Before each COMMIT.json the checkpointer
lists the run's attempt records; a newer one stops it with FencedError instead of committing, and
the check is repeated right after the write, so a commit that raced the new record is taken back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from glue.train.errors import CheckpointError
from glue.train.layout import ATTEMPTS_PREFIX, COMMIT, attempt_of
from glue.train.storage.target import Storage


class FencedError(CheckpointError):
    """A newer attempt of this run exists: this trainer must stop without committing."""


class FencedStorage:
    """The checkpoint storage, with the attempt check in front of every COMMIT.json write."""

    def __init__(self, inner: Storage, run_store: Storage, run: str, attempt: int) -> None:
        self.inner = inner
        self.run_store = run_store  # runs/<run>/ in the bucket
        self.run = run
        self.attempt = attempt

    def newest_attempt(self) -> int:
        found = (attempt_of(k) for k in self.run_store.list(ATTEMPTS_PREFIX))
        return max((n for n in found if n is not None), default=self.attempt)

    def _fenced(self, key: str, done: str) -> FencedError | None:
        newest = self.newest_attempt()
        if newest <= self.attempt:
            return None
        return FencedError(f"attempt {newest} of run {self.run} has replaced this trainer's attempt {self.attempt}:"
                           f" {done} {key}; this trainer must stop")

    def put(self, key: str, data: bytes | bytearray) -> None:
        if key.rsplit("/", 1)[-1] != COMMIT:
            self.inner.put(key, data)
            return
        if (before := self._fenced(key, "not committing")) is not None:
            raise before
        self.inner.put(key, data)
        # The store has no conditional write: a trainer paused between the check above and this put could
        # commit after its replacement was recorded. Look again and take that commit back (only the
        # COMMIT.json this call just wrote; the step's objects stay, as an interrupted save's do).
        if (after := self._fenced(key, "took back the commit of")) is not None:
            self.inner.delete([key])
            raise after

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        return self.inner.get(key, size_hint)

    def list(self, prefix: str = "") -> dict[str, int]:
        return self.inner.list(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)

    def describe(self) -> str:
        return self.inner.describe()

    def check(self) -> None:
        self.inner.check()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # anything else a storage offers (transfer helpers)

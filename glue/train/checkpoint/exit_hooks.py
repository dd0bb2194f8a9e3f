"""A pending save survives the end of the process: it is flushed on SIGTERM and at normal exit.

Without this, a trainer stopped by its supervisor (SIGTERM) or returning from main() while a save
is still uploading would lose that checkpoint. The SIGTERM handler chains to the one it replaced
(or to the default action), so the process still ends the way it would have.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (registers its exit hook before ours: see below)
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol


class PendingSave(Protocol):
    """What the hooks flush (a Checkpointer). Must not raise."""

    def _flush_quietly(self, why: str) -> None: ...


_live: weakref.WeakSet[PendingSave] = weakref.WeakSet()


def flush_at_exit(owner: PendingSave) -> None:
    """Flush owner's pending save at normal interpreter exit (until forget(owner))."""
    _live.add(owner)


def forget(owner: PendingSave) -> None:
    _live.discard(owner)


def _flush_all_at_exit() -> None:
    for owner in list(_live):
        owner._flush_quietly("interpreter exit")


# Run before concurrent.futures stops accepting work at interpreter exit (boto3's transfer
# threads need it), i.e. before non-daemon threads are joined; plain atexit would be too late.
# These hooks run in reverse order of registration: concurrent.futures.thread, imported above,
# has registered its own already, so ours runs first.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_flush_all_at_exit)
else:  # pragma: no cover - CPython has had it since 3.9
    import atexit

    atexit.register(_flush_all_at_exit)


class SigtermFlush:
    """Installs a SIGTERM handler (main thread only) that flushes, then hands the signal on."""

    def __init__(self, flush: Callable[[str], None]) -> None:
        self._flush = flush
        self._pid = os.getpid()
        self._prev: Any = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def remove(self) -> None:
        """Put the previous handler back, unless someone replaced ours since."""
        if self._prev is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # A forked child (a DataLoader worker) inherits the handler but not the uploader thread: its
        # copy of a pending save would never complete, so it only hands the signal on.
        if os.getpid() == self._pid:
            self._flush("SIGTERM")
        prev = self._prev
        signal.signal(signal.SIGTERM, prev if prev is not None else signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)  # default action: terminate, as if we were not here

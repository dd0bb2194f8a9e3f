"""The termination notice: a VM about to be taken away (preemption, spot reclaim, maintenance).

A notice arrives as SIGTERM or as a file the backend writes on the VM (GPUKIT_NOTICE_FILE, default
/run/gpukit/termination-notice, as clouds announce a reclaim through their metadata service). Both
only SET a flag, from the signal handler or a small polling thread: the flag stays set until the
trainer reaches its next step boundary (`RunContext.step`), so a notice that lands during evaluation,
warm-up or a save is never missed. There the trainer saves a checkpoint at that step (blocking,
committed), records the notice and exits with PREEMPTED_EXIT, which the controller classifies as
`preempted`, not as a crash.

A third source is a deadline known in advance (GPUKIT_STOP_AT, epoch seconds): a place to run that caps
how long one execution may last (Lyceum's serverless runs) gets the same save-and-exit before the cap,
and the next execution resumes from that checkpoint.

Under torchrun SIGTERM is not a notice: the agent sends it to stop the workers when the group fails
or restarts, and then they must stop at once (a checkpoint would be a collective with a dead peer).
There only the notice file counts (on every node: the backend writes it on each VM).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from glue.train import trainer_vars

NOTICE_FILE_ENV = trainer_vars.NOTICE_FILE
STOP_AT_ENV = trainer_vars.STOP_AT
DEFAULT_NOTICE_FILE = "/run/gpukit/termination-notice"
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: stopped on purpose, try again elsewhere
POLL_S = 0.25


class TerminationNotice:
    """A flag set by SIGTERM, by the notice file appearing or by the stop-at deadline passing; checked at
    step boundaries."""

    def __init__(self, path: str | None = None, poll_s: float = POLL_S, sigterm: bool = True,
                 stop_at: float | None = None) -> None:
        self.path = Path(path or os.environ.get(NOTICE_FILE_ENV) or DEFAULT_NOTICE_FILE)
        self.stop_at = stop_at if stop_at is not None else _stop_at_from_env()
        self._sigterm = sigterm
        self.source: str | None = None
        self.seen_at: float | None = None
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._poll_s = poll_s
        self.install()
        self._thread = threading.Thread(target=self._poll, name="gpukit-notice", daemon=True)
        self._thread.start()

    def install(self) -> None:
        """(Re)install the SIGTERM handler on top (main thread only). Called again after a Checkpointer
        was made: its flush-and-exit handler must not pre-empt the save at the step boundary."""
        if self._sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._set("SIGTERM")  # only a flag: no I/O, no locks inside a signal handler

    def _set(self, source: str) -> None:
        if not self._flag.is_set():
            self.source, self.seen_at = source, time.time()
            self._flag.set()

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            if self.path.exists():
                self._set(f"notice file {self.path}")
                return
            if self.stop_at is not None and time.time() >= self.stop_at:
                self._set(f"stop-at deadline {self.stop_at:.0f} ({STOP_AT_ENV}: the execution's cap is near)")
                return

    @property
    def pending(self) -> bool:
        return self._flag.is_set()

    def close(self) -> None:
        self._stop.set()


def _stop_at_from_env() -> float | None:
    raw = os.environ.get(STOP_AT_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{STOP_AT_ENV}={raw!r} is not epoch seconds") from None

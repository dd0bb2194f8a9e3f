"""The notices a watcher owes: queued in the run's watch state (in the bucket) in the same write as the action
they announce, then sent, then removed. A watcher killed in between leaves its notice queued, and the next
watcher of the run sends what has been queued for longer than any send can take: every notice arrives at least
once (twice only when a watcher dies after sending one and before removing it)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from glue.runs.config import NotifySpec
from glue.runs.store import RunStore
from glue.watch import notify
from glue.watch.watch_state import WatchState

# Longer than one send can take (the command's timeout, then every try of the webhook's connect and read): a
# notice queued for longer was left by a watcher that died, not one still sending it.
_TRIES = (notify.WEBHOOK_RETRY.total or 0) + 1
STALE_S = 2 * (notify.COMMAND_TIMEOUT_S + 2 * notify.WEBHOOK_TIMEOUT_S * _TRIES)


def queue(st: WatchState, event: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """`event` owed: kept in the state (saved by the caller, with the action it announces)."""
    entry = {"queued_at": time.time() if now is None else now, "event": event}
    st.outbox = [*st.outbox, entry]
    return entry


def deliver(st: WatchState, spec: NotifySpec, entry: dict[str, Any], console: Console) -> None:
    """Send a queued notice to the run's hooks and take it out of the state (a hook that fails is said and
    noted, never retried: it answered)."""
    event = entry["event"]
    results = notify.send(spec, event)
    for hook, result in results.items():
        if result != "ok":
            console.print(f"[yellow]notify {hook} for {event.get('event')} of {st.run} failed: {result}[/]")
    st.outbox = [e for e in st.outbox if e != entry]
    if results:
        st.note("notified", event=event.get("event"), results=results)


def flush(store: RunStore, st: WatchState, spec: NotifySpec, console: Console, now: float | None = None) -> int:
    """Send the notices a dead watcher left queued (older than STALE_S); returns how many."""
    now = time.time() if now is None else now
    left = [e for e in st.outbox if now - float(e.get("queued_at") or 0) >= STALE_S]
    for entry in left:
        console.print(f"[yellow]{st.run}: sending the {entry['event'].get('event')} notice a stopped watcher "
                      "left unsent[/]")
        deliver(st, spec, entry, console)
    if left:
        st.save(store)
    return len(left)

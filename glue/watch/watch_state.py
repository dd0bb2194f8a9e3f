"""The watcher's state of one run, in the bucket beside the run (RunStore.watch_state), so a
watcher restarted anywhere (even after SIGKILL) carries on with the same counts.

A recovery is counted BEFORE it starts: a watcher killed mid-recovery has still spent that budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from glue.operations.recovery.resume_plan import ResumePlan
from glue.runs.classify import AttemptClass
from glue.runs.config import RecoverySpec
from glue.runs.records import RecoveryRecord
from glue.runs.store import RunStore, utc_iso
from glue.watch.policy import Decision, backoff

HISTORY = 50  # actions kept in the state (events also go to the notification hooks)


@dataclass
class WatchState:
    run: str
    used: dict[str, int] = field(default_factory=lambda: {"preemptions": 0, "failures": 0})
    failed_in_row: int = 0
    next_try_at: float = 0.0          # epoch seconds: the backoff ends
    handled_attempt: int | None = None  # the failed attempt the last recovery (or stop) was for
    stopped: str | None = None        # why the watcher stopped acting on this run (None = watching)
    done: bool = False                # completed: no more polls
    adopted_attempt: int | None = None  # the latest attempt when a watcher first saw the run
    # A recovery's new attempt runs and its resume is not checked yet (glue.operations.recovery.recover.plan): kept
    # while the recovery runs, so a watcher that finds it interrupted makes the check itself.
    resume_plan: ResumePlan | None = None
    # Recoveries of handled_attempt that found no capacity (NoCapacity): waited out with backoff, never a
    # failed recovery, never another budget.
    capacity_waits: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    # Notices decided and not yet sent (glue.watch.outbox): saved with the action they announce.
    outbox: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, store: RunStore) -> WatchState | None:
        doc = store.watch_state()
        if not doc:
            return None
        known = set(cls.__dataclass_fields__)
        st = cls(**{k: v for k, v in doc.items() if k in known})
        st.resume_plan = ResumePlan.from_dict(doc["resume_plan"]) if doc.get("resume_plan") else None
        return st

    def save(self, store: RunStore) -> None:
        store.put_watch_state({**asdict(self), "updated_at": utc_iso()})  # asdict writes resume_plan's JSON too

    def note(self, action: str, **detail: Any) -> dict[str, Any]:
        entry = {"at": utc_iso(), "action": action, **detail}
        self.history = [*self.history, entry][-HISTORY:]
        return entry

    def wait_for_capacity(self, spec: RecoverySpec, n: int, outcome: str, error: str, now: float) -> float:
        """A recovery of attempt n found no capacity: wait (the failure budget's backoff, by waits in a
        row) and try again; returns the wait in seconds."""
        self.resume_plan = None
        self.capacity_waits += 1
        wait = backoff(spec, self.capacity_waits)
        self.next_try_at = now + wait
        self.note("waiting_for_capacity", attempt=n, outcome=outcome, error=error, backoff_s=wait,
                  waits=self.capacity_waits)
        return wait

    @property
    def last(self) -> dict[str, Any] | None:
        return self.history[-1] if self.history else None

    def capacity_waits_of(self, n: int) -> int:
        """Times the recovery of attempt n's failure found no capacity so far."""
        return self.capacity_waits if self.handled_attempt == n else 0

    def failed_tries(self, n: int, never_started: bool = False) -> int:
        """Failed recoveries of attempt n's failure so far (0: not tried yet, a new failure). A recovery of
        it whose watcher died before the new attempt started counts as one: it spent the budget already.
        So does attempt n itself when that recovery recorded it but died before its trainer started
        (`never_started`): its failure is the interrupted recovery's, retried."""
        if self.handled_attempt != n:
            last = self.last or {}
            if never_started and last.get("action") == "recovery_interrupted" and last.get("new_attempt") == n:
                return max(self.failed_in_row, 1)
            return 0
        interrupted = (self.last or {}).get("action") == "recovering"
        return max(self.failed_in_row, 1) if interrupted else self.failed_in_row


@dataclass
class Row:
    """One run's line in the watcher's table (and in `glue watch --status --json`)."""

    run: str
    state: str
    attempt: int | None = None
    step: int | None = None
    outcome: str = ""
    used: dict[str, int] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    last: str = ""
    note: str = ""


def summary(rec: RecoveryRecord) -> dict[str, Any]:
    """What the watch state's history and the `recovered` notice say of a recovery."""
    return {"failed_attempt": rec.failed_attempt, "new_attempt": rec.new_attempt,
            "checkpoint_step": rec.checkpoint_step, "failure_step": rec.failure_step,
            "first_resumed_step": rec.first_resumed_step, "verified": rec.verified}


def describe(entry: dict[str, Any] | None) -> str:
    """A history entry as one short line (the watcher's table)."""
    if not entry:
        return ""
    bits = [str(entry.get("action"))]
    for key in ("attempt", "outcome", "new_attempt", "event"):
        if entry.get(key) is not None:
            bits.append(f"{key}={entry[key]}")
    return " ".join(bits) + f" at {str(entry.get('at', ''))[11:19]}"


def record_budget_incident(store: RunStore, st: WatchState, n: int, outcome: AttemptClass, decision: Decision,
                           reason: str) -> str:
    """The `budget_exhausted` incident of attempt n; returns its key."""
    now = utc_iso()
    return store.put_incident({
        "run": store.run, "attempt": n, "class": "budget_exhausted", "reason": decision.reason,
        "policy": "stopped: no more automatic recoveries; recover by hand (`glue recover`) once the cause is "
                  "understood, or raise the budget",
        "detected_at": now, "failure_class": str(outcome), "failure_reason": reason, "budget": decision.budget,
        "used": dict(st.used), "history": st.history[-10:],
    }, "budget_exhausted", now)

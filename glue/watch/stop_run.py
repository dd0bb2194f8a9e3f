"""`glue stop --run X`: end a run's latest attempt on request, wherever it runs, and have every watcher
leave it be.

The trainer is killed on its VM(s), or the serverless execution aborted (glue.operations.recovery.phases
.kill_attempt); the attempt is recorded `killed` with the reason, so no monitor takes it for a failure
to recover; the run's watch state says stopped. A later `glue deploy --resume` or `glue recover` starts
a new attempt from the newest valid checkpoint, and a watcher takes that one on again.
"""

from __future__ import annotations

from pathlib import Path

from glue.errors import GlueError
from glue.operations.recovery import phases
from glue.runs import lease, monitor
from glue.runs.class_policy import STOPPED_ON_REQUEST
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, utc_iso
from glue.watch.watch_state import WatchState

REASON = STOPPED_ON_REQUEST


def stop_run(home: Path, run_id: str) -> str:
    store = RunStore.open(home, run_id)
    store.read_manifest()  # an unknown run: one line
    if not store.attempts():
        raise GlueError(f"run {run_id} has no attempt to stop")
    with lease.held(store, "stop"):  # not while a deploy or recover starts the next attempt
        report = monitor.check(home, store, record_incident=False)
        n = report.attempt.attempt
        if report.diagnosis.outcome is AttemptClass.COMPLETED:
            raise GlueError(f"run {run_id} completed; nothing to stop")
        rec = store.read_attempt(n) or report.attempt
        running = report.diagnosis.outcome is AttemptClass.RUNNING
        phases.kill_attempt(home, store, rec)
        if not rec.failure_class:
            rec.update(failure_class=str(AttemptClass.KILLED), reason=REASON, ended_at=utc_iso())
            store.put_attempt(rec)
        st = WatchState.load(store) or WatchState(run_id, adopted_attempt=n)
        st.stopped, st.handled_attempt, st.resume_plan = REASON, n, None
        st.note("stopped", attempt=n, why=REASON)
        st.save(store)
    where = f"Lyceum execution {rec.execution_id} aborted" if rec.execution else "its trainer killed"
    was = "" if running else f" (it had ended: {report.diagnosis.outcome}; no watcher will recover it)"
    return f"run {run_id}: attempt {n} stopped, {where}{was}; `glue deploy --resume` or `glue recover` continues it"

"""A run's watch state when a watcher picks it up: created on first sight, taken on again after a new
attempt or when named, and a recovery whose watcher died noticed."""

from __future__ import annotations

from collections.abc import Callable

from glue.runs import lease, monitor
from glue.runs.store import RunStore
from glue.watch.watch_state import WatchState

LEFT_ALONE = "before a watcher saw the run"  # a watcher of every run leaves such a run alone


def adopt(store: RunStore, latest: int, named: bool, say: Callable[[str], object]) -> WatchState:
    """The run's state, created when a watcher first sees it. Watching every run, one whose latest
    attempt had already ended is left alone (`glue watch --run X`, `named`, takes it on); a new attempt (a
    deploy --resume after a stop) is watched again, its budgets as they were."""
    st = WatchState.load(store)
    if st is None:
        st = WatchState(store.run, adopted_attempt=latest)
        rec = store.read_attempt(latest)
        ended = rec and (rec.failure_class or rec.outcome)
        if ended and not named:
            st.stopped = f"attempt {latest} had ended ({ended}) {LEFT_ALONE}"
            st.handled_attempt = latest
        st.save(store)
    elif named and st.stopped and st.stopped.endswith(LEFT_ALONE) and st.handled_attempt == latest:
        # Left alone by a watcher of every run; named with --run, it is taken on.
        st.stopped, st.handled_attempt = None, None
        st.note("watching", attempt=latest, why="named with glue watch --run")
        st.save(store)
    elif (st.stopped or st.done) and st.handled_attempt is not None and latest > st.handled_attempt:
        st.stopped, st.done = None, False
        st.note("watching", attempt=latest, why="a new attempt was deployed")
        st.save(store)
    elif (st.last or {}).get("action") == "recovering" and st.handled_attempt is not None \
            and latest > st.handled_attempt and not lease.current(store):
        # A watcher died mid-recovery after the new attempt started. With the recovery's plan (saved
        # once the attempt started) the resume is checked as `glue recover` would have, once the new
        # attempt has run far enough; without it (died in between) it runs unverified.
        plan = st.resume_plan if st.resume_plan and st.resume_plan.new_attempt == latest else None
        st.resume_plan = plan
        beat = store.heartbeat()
        unstarted = plan is None and not monitor.trainer_started(store.read_attempt(latest), beat)
        st.note("recovery_interrupted", attempt=st.handled_attempt, new_attempt=latest,
                why="the watcher stopped mid-recovery; " + (
                    f"the resume is checked once attempt {latest} passes step {plan.upto}" if plan else
                    f"attempt {latest}'s trainer had not started: if it never does, that recovery is retried"
                    if unstarted else "the new attempt's resume cannot be verified (no plan recorded)"))
        st.save(store)
        then = "is checked as it runs" if plan else "is retried unless its trainer started" if unstarted \
            else "runs unverified"
        say(f"[yellow]{store.run}: the recovery of attempt {st.handled_attempt} was interrupted "
            f"(its watcher stopped); attempt {latest} {then}[/]")
    return st

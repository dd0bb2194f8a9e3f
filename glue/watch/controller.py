"""The watcher: poll runs, classify their latest attempt, act by the decision table (glue.watch.policy).

One poll of one run:
  fast path   single-node attempt, its VM there, a fresh heartbeat (younger than
              monitor.lost_after_seconds), step younger than the stall timeout, no exit record
              -> running, without SSH or reading logs
  otherwise   the monitor's full check (it refreshes expiring credentials and pushes them to the
              VMs, classifies, records the incident of a new failure)
  then        policy.decide: recover (through `glue recover`'s verified path, under the run's
              lease, counted in the bucket before it starts), wait out the backoff, or stop with an
              incident and a notification.
Two watchers never act on one run: the decision is taken again under the run's lease, against the
state in the bucket and the latest attempt; a watcher that loses the lease leaves the run alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import state as cluster_state
from glue.errors import GlueError
from glue.recovery import recover as recover_mod
from glue.runs import config as runconfig
from glue.runs import deploy as deploy_mod
from glue.runs import lease, monitor
from glue.runs.classify import Outcome
from glue.runs.store import RunStore, parse_iso, run_ids, utc_iso
from glue.train.layout import exit_key
from glue.watch import notify, policy
from glue.watch.state import WatchState


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


def _age_s(ts: str | None) -> float | None:
    return None if not ts else time.time() - parse_iso(ts).timestamp()


class Watcher:
    def __init__(self, home: Path, runs: tuple[str, ...], console: Console, keep_failed: bool = False,
                 tolerance: float = 0.0,
                 pause: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        self.home, self.runs, self.console = home, runs, console
        self.keep_failed, self.tolerance, self.pause = keep_failed, tolerance, pause
        self._stores: dict[str, RunStore] = {}
        self._configs: dict[str, tuple[runconfig.RunConfig, float | None]] = {}

    def validate(self) -> None:
        """Refuse, in one line, runs asked for by name that the bucket does not have."""
        for run in self.runs:
            self._store(run).manifest()  # GlueError: unknown run 'x'

    # -- the poll -------------------------------------------------------------------------------
    def poll(self) -> list[Row]:
        rows: list[Row] = []
        try:
            cluster_state.refresh_credentials(self.home)  # with nothing else polling, credentials still follow
            names = list(self.runs) or self._all_runs()
        except GlueError as exc:
            return [Row(run="*", state="error", note=str(exc))]
        for run in names:
            try:
                rows.append(self.watch_run(run))
            except GlueError as exc:  # one run's trouble (bucket hiccup, bad record) must not stop the others
                rows.append(Row(run=run, state="error", note=str(exc)))
        return rows

    def _all_runs(self) -> list[str]:
        store = deploy_mod.open_store(self.home, "_")
        return [r for r in run_ids(store.info, store.creds) if "-drill" not in r]

    def _store(self, run: str) -> RunStore:
        if run not in self._stores:
            self._stores[run] = deploy_mod.open_store(self.home, run)
        return self._stores[run]

    def _config(self, store: RunStore) -> tuple[runconfig.RunConfig, float | None]:
        if store.run not in self._configs:
            manifest = store.manifest()
            rc = runconfig.parse(manifest["config"], store.run, store.info.name)
            created = manifest.get("created_at")
            self._configs[store.run] = (rc, parse_iso(created).timestamp() if created else None)
        return self._configs[store.run]

    def watch_run(self, run: str) -> Row:
        store = self._store(run)
        rc, started = self._config(store)
        attempts = store.attempts()
        if not attempts:
            return Row(run=run, state="waiting", note="no attempt yet")
        latest = attempts[-1]
        st = self._adopt(store, latest)
        row = Row(run=run, state="watching", attempt=latest, used=dict(st.used),
                  caps={"preemptions": rc.recovery.max_preemptions, "failures": rc.recovery.max_failures},
                  last=_describe(st.last))
        if st.done or st.stopped:
            row.state, row.note = ("completed", "") if st.done else ("stopped", st.stopped or "")
            return row
        quick = self._fast_running(store, rc, latest)
        if quick is not None:
            row.state, row.step, row.outcome = "running", quick, "running"
            return row
        report = monitor.check(self.home, store)
        outcome, n = report.verdict.outcome, int(report.attempt["attempt"])
        row.outcome, row.step, row.attempt = str(outcome), (report.heartbeat or {}).get("step"), n
        decision = policy.decide(outcome, rc.recovery, st.used, time.time(), st.next_try_at, started,
                                 _retry(st, n))
        row.state, row.note = decision.action if decision.action != "none" else "running", decision.reason
        if decision.action == "done":
            st.done, st.handled_attempt = True, n
            st.note("completed", attempt=n)
            st.save(store)
            row.state = "completed"
        elif decision.action == "stop":
            row.note = self._stop_held(store, rc, n, outcome, decision, report.verdict.reason,
                                       report.incident_key or report.attempt.get("incident")) or row.note
        elif decision.action == "recover":
            row.note = self._recover(store, rc, started, n, outcome)
            fresh = WatchState.load(store) or st
            row.used, row.last = dict(fresh.used), _describe(fresh.last)
        return row

    def _adopt(self, store: RunStore, latest: int) -> WatchState:
        """The run's state, created when a watcher first sees it. Watching every run, one whose latest
        attempt had already ended is left alone (`glue watch --run X` takes it on); a new attempt (a
        deploy --resume after a stop) is watched again, its budgets as they were."""
        st = WatchState.load(store)
        if st is None:
            st = WatchState(store.run, adopted_attempt=latest)
            rec = store.attempt(latest)
            ended = rec.get("failure_class") or rec.get("outcome")
            if ended and not self.runs:
                st.stopped = f"attempt {latest} had ended ({ended}) before a watcher saw the run"
                st.handled_attempt = latest
            st.save(store)
        elif (st.stopped or st.done) and st.handled_attempt is not None and latest > st.handled_attempt:
            st.stopped, st.done = None, False
            st.note("watching", attempt=latest, why="a new attempt was deployed")
            st.save(store)
        elif (st.last or {}).get("action") == "recovering" and st.handled_attempt is not None \
                and latest > st.handled_attempt and not lease.current(store):
            # A watcher died mid-recovery after the new attempt started: it runs, but nobody checked its
            # resume. Say so (the budget was spent); the check cannot be re-run once it trains on.
            st.note("recovery_interrupted", attempt=st.handled_attempt, new_attempt=latest,
                    why="the watcher stopped mid-recovery; the new attempt's resume was not verified")
            st.save(store)
            self.console.print(f"[yellow]{store.run}: the recovery of attempt {st.handled_attempt} was interrupted "
                               f"(its watcher stopped); attempt {latest} runs unverified[/]")
        return st

    def _fast_running(self, store: RunStore, rc: runconfig.RunConfig, latest: int) -> int | None:
        """The heartbeat's step when the run plainly runs (no SSH, no log reads); None = look closer."""
        rec = store.attempt(latest)
        if len(rec.get("nodes") or []) > 1 or rec.get("failure_class") or rec.get("outcome"):
            return None
        beat = store.get_json("heartbeat.json")
        if not beat or beat.get("attempt") != latest:
            return None
        fresh = _age_s(beat.get("updated_at"))
        moving = _age_s(beat.get("step_at") or beat.get("started_at"))
        if fresh is None or fresh > rc.monitor.lost_after_seconds or moving is None \
                or moving > rc.monitor.stall_timeout_seconds or beat.get("held"):
            return None
        if store.get_json(exit_key(latest, 0)) is not None:
            return None
        backend = get_backend(str(rec.get("backend", "local")), self.home)
        if backend.read_vm(str(rec.get("vm_id"))) is None:
            return None
        step = beat.get("step")
        return int(step) if isinstance(step, int) else 0

    # -- acting ---------------------------------------------------------------------------------
    def _event(self, rc: runconfig.RunConfig, st: WatchState, kind: str, attempt: int, outcome: Outcome | str,
               **detail: Any) -> None:
        event = {"event": kind, "run": st.run, "attempt": attempt, "class": str(outcome), "at": utc_iso(),
                 "used": dict(st.used),
                 "budgets": {"preemptions": rc.recovery.max_preemptions, "failures": rc.recovery.max_failures},
                 **detail}
        results = notify.send(rc.notify, event)
        for hook, result in results.items():
            if result != "ok":
                self.console.print(f"[yellow]notify {hook} for {kind} of {st.run} failed: {result}[/]")
        if results:
            st.note("notified", event=kind, results=results)

    def _stop_held(self, store: RunStore, rc: runconfig.RunConfig, n: int, outcome: Outcome,
                   decision: policy.Decision, reason: str, incident: str | None) -> str | None:
        """Stop under the run's lease, once: a second watcher finds it stopped and sends nothing."""
        try:
            with lease.held(store, "watch"):
                st = WatchState.load(store) or WatchState(store.run)
                if st.stopped or store.attempts()[-1] != n:
                    return None
                self._stop(store, rc, st, n, outcome, decision, reason, incident)
                return None
        except GlueError as exc:
            if "is being changed by" in str(exc):
                return f"another controller acts on it: {exc}"
            raise

    def _stop(self, store: RunStore, rc: runconfig.RunConfig, st: WatchState, n: int, outcome: Outcome,
              decision: policy.Decision, reason: str, incident: str | None) -> None:
        st.stopped, st.handled_attempt = decision.reason, n
        if decision.event == "budget_exhausted":
            incident = _budget_incident(store, st, n, outcome, decision, reason)
        st.note("stopped", attempt=n, outcome=str(outcome), reason=decision.reason, incident=incident)
        st.save(store)
        self.console.print(f"[red]{store.run}: stopped[/] ({decision.reason})")
        if decision.event:
            self._event(rc, st, decision.event, n, outcome, reason=reason, decision=decision.reason,
                        incident=incident)
            st.save(store)

    def _recover(self, store: RunStore, rc: runconfig.RunConfig, started: float | None, n: int,
                 outcome: Outcome) -> str:
        try:
            with self.pause(), lease.held(store, "watch"):
                return self._recover_held(store, rc, started, n, outcome)
        except GlueError as exc:
            if "is being changed by" in str(exc):
                return f"another controller acts on it: {exc}"
            raise

    def _recover_held(self, store: RunStore, rc: runconfig.RunConfig, started: float | None, n: int,
                      outcome: Outcome) -> str:
        # Decide again under the lease, on the bucket's state: another watcher may have acted meanwhile.
        st = WatchState.load(store) or WatchState(store.run)
        if store.attempts()[-1] != n or st.stopped or st.done:
            return "already handled"
        retry = _retry(st, n)
        decision = policy.decide(outcome, rc.recovery, st.used, time.time(), st.next_try_at, started, retry)
        if decision.action != "recover" or decision.budget is None:
            return decision.reason
        if retry == 0:  # a new failure takes one from its budget; retrying the same one does not
            st.used[decision.budget] = st.used.get(decision.budget, 0) + 1
        st.handled_attempt = n
        st.note("recovering", attempt=n, outcome=str(outcome), budget=decision.budget)
        st.save(store)  # counted before it starts: a watcher killed mid-recovery has spent it
        self.console.print(f"[bold]{store.run}[/]: attempt {n} {outcome}: {decision.reason}")
        keep = self.keep_failed or rc.recovery.keep_failed
        try:
            result = recover_mod.recover(self.home, store.run, self.console, tolerance=self.tolerance,
                                         keep_failed=keep)
        except GlueError as exc:
            st.failed_in_row += 1
            wait = policy.backoff(rc.recovery, st.failed_in_row)
            st.next_try_at = time.time() + wait
            st.note("recovery_failed", attempt=n, outcome=str(outcome), error=str(exc), backoff_s=wait)
            st.save(store)
            self.console.print(f"[red]{store.run}: recovery of attempt {n} failed[/]: {exc} (next try in {wait:.0f}s)")
            self._event(rc, st, "recovery_failed", n, outcome, error=str(exc), backoff_s=wait)
            st.save(store)
            return f"recovery failed: {exc}"
        st.failed_in_row, st.next_try_at = 0, 0.0
        summary = {k: result.get(k) for k in ("failed_attempt", "new_attempt", "checkpoint_step", "failure_step",
                                               "first_resumed_step", "verified")}
        summary["kept_vm"] = result.get("kept_vm")
        st.note("recovered", outcome=str(outcome), **summary)
        st.save(store)
        self._event(rc, st, "recovered", n, outcome, recovery=summary)
        st.save(store)
        return f"recovered onto attempt {result['new_attempt']} (verified)"


def _retry(st: WatchState, n: int) -> int:
    """Failed recoveries of attempt n's failure so far (0: not tried yet, a new failure)."""
    return st.failed_in_row if st.handled_attempt == n else 0


def _describe(entry: dict[str, Any] | None) -> str:
    if not entry:
        return ""
    bits = [str(entry.get("action"))]
    for key in ("attempt", "outcome", "new_attempt", "event"):
        if entry.get(key) is not None:
            bits.append(f"{key}={entry[key]}")
    return " ".join(bits) + f" at {str(entry.get('at', ''))[11:19]}"


def _budget_incident(store: RunStore, st: WatchState, n: int, outcome: Outcome, decision: policy.Decision,
                     reason: str) -> str:
    now = utc_iso()
    key = f"incidents/{now.replace(':', '').replace('-', '')}-budget_exhausted.json"
    store.put_json(key, {
        "run": store.run, "attempt": n, "class": "budget_exhausted", "reason": decision.reason,
        "policy": "stopped: no more automatic recoveries; recover by hand (`glue recover`) once the cause is "
                  "understood, or raise the budget",
        "detected_at": now, "failure_class": str(outcome), "failure_reason": reason, "budget": decision.budget,
        "used": dict(st.used), "history": st.history[-10:],
    })
    return key


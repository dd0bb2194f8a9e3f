"""The watcher: poll runs, classify their latest attempt, act by the decision table (glue.watch.policy).

One poll of one run:
  fast path   single-node attempt, its VM there, a heartbeat on time, step younger than the stall
              timeout, no exit record -> running, without SSH or reading logs. A late heartbeat starts
              an SSH probe in the background (glue.watch.ssh_probe); while it has not been answered the
              run counts as running, and the watcher polls again when its window closes, so a VM the
              backend still reports but that does not answer is lost by monitor.lost_after_seconds
              after its last heartbeat
  otherwise   the monitor's full check (told which VM the probe found silent; it refreshes expiring
              credentials and pushes them to the VMs, classifies, records the incident of a new failure)
  then        policy.decide: recover (through `glue recover`'s verified path, under the run's lease,
              counted in the bucket before it starts), wait out the backoff, or stop (incident, notification).
Two watchers never act on one run: the decision is taken again under the run's lease, against the
state in the bucket and the latest attempt; a watcher that loses the lease leaves the run alone.
A run a scheduler restarts itself (Slurm) is the `scheduled` hook's: glue never recovers it beside it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import credentials as cluster_credentials
from glue.cluster import current
from glue.errors import GlueError, NoCapacity
from glue.operations.recovery import phases
from glue.operations.recovery import recover as recover_mod
from glue.operations.recovery.resume_plan import ResumePlan
from glue.runs import config as runconfig
from glue.runs import lease, monitor, records
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, all_run_ids, parse_iso, utc_iso
from glue.watch import interrupted, outbox, policy
from glue.watch import ssh_probe as probe_mod
from glue.watch.adopt import adopt
from glue.watch.watch_state import Row, WatchState, describe, record_budget_incident
from glue.watch.watch_state import summary as recovery_summary


def _age_s(ts: str | None) -> float | None:
    return None if not ts else time.time() - parse_iso(ts).timestamp()


@dataclass(frozen=True)
class Quick:
    """The fast path's answer: running (with the heartbeat's step), or look closer (the full check),
    telling it the VMs the probe found silent."""

    running: bool
    step: int | None = None
    note: str = ""
    unreachable: frozenset[str] = frozenset()


class Watcher:
    def __init__(self, home: Path, runs: tuple[str, ...], console: Console, *, keep_failed: bool = False,
                 tolerance: float = 0.0, pause: Callable[[], AbstractContextManager[None]] = nullcontext,
                 single_pass: bool = False, stores: Mapping[str, RunStore] | None = None,
                 scheduled: Callable[[RunStore], Row | None] | None = None) -> None:
        """stores: the RunStore of a run (default: opened from the kit home's bucket on first use).
        scheduled: a run a job scheduler restarts itself (Slurm) gets this row instead of glue's recovery."""
        self.home, self.runs, self.console, self.scheduled = home, runs, console, scheduled
        # `--once` (a cron job): no later poll collects a background probe's answer: a late heartbeat gets
        # the full check (SSH, process state) in this pass.
        self.single_pass, self.keep_failed, self.tolerance, self.pause = single_pass, keep_failed, tolerance, pause
        self._stores: dict[str, RunStore] = dict(stores or {})
        self._configs: dict[str, tuple[runconfig.RunConfig, float | None]] = {}
        self._probes: dict[str, probe_mod.Probe] = {}
        # Seconds a poll took to class a lost VM without SSH: the probe's verdict comes that much (x1.25) sooner.
        self._lost_check_s = 0.0
        self.wake_at: float | None = None  # epoch seconds: poll again no later than this (a probe's window)

    def _wake(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    def validate(self) -> None:
        """Refuse, in one line, runs asked for by name that the bucket does not have."""
        for run in self.runs:
            self._store(run).read_manifest()  # GlueError: unknown run 'x'

    # -- the poll -------------------------------------------------------------------------------
    def poll(self) -> list[Row]:
        rows: list[Row] = []
        self.wake_at = None
        try:
            cluster_credentials.refresh(self.home)  # with nothing else polling, credentials still follow
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
        return [r for r in all_run_ids(self.home) if "-drill" not in r]

    def _store(self, run: str) -> RunStore:
        if run not in self._stores:
            self._stores[run] = RunStore.open(self.home, run)
        return self._stores[run]

    def _config(self, store: RunStore) -> tuple[runconfig.RunConfig, float | None]:
        if store.run not in self._configs:
            manifest = store.read_manifest()
            rc = runconfig.parse(manifest.config, store.run, store.info.name)
            created = manifest.created_at
            self._configs[store.run] = (rc, parse_iso(created).timestamp() if created else None)
        return self._configs[store.run]

    def watch_run(self, run: str) -> Row:
        t0 = time.monotonic()
        store = self._store(run)
        if self.scheduled is not None and (taken := self.scheduled(store)) is not None:
            return taken
        rc, started = self._config(store)
        attempts = store.attempts()
        if not attempts:
            return Row(run=run, state="waiting", note="no attempt yet")
        latest = attempts[-1]
        st = adopt(store, latest, named=bool(self.runs), say=self.console.print)
        outbox.flush(store, st, rc.notify, self.console)
        row = Row(run=run, state="watching", attempt=latest, used=dict(st.used),
                  caps={"preemptions": rc.recovery.max_preemptions, "failures": rc.recovery.max_failures},
                  last=describe(st.last))
        if st.done or st.stopped:
            row.state, row.note = ("completed", "") if st.done else ("stopped", st.stopped or "")
            return row
        pending = ""
        if st.resume_plan is not None and not lease.current(store):
            pending = self._verify_interrupted(store, rc, started, st) or ""
            st = WatchState.load(store) or st
            row.used, row.last = dict(st.used), describe(st.last)
            if st.stopped:
                row.state, row.note = "stopped", st.stopped
                return row
        quick = self._fast_running(store, rc, latest)
        if quick.running:
            row.state, row.step, row.outcome, row.note = "running", quick.step, "running", quick.note or pending
            return row
        self._probes.pop(run, None)
        report = monitor.check(self.home, store, unreachable=quick.unreachable)
        outcome, n = report.diagnosis.outcome, report.attempt.attempt
        if outcome is AttemptClass.VM_LOST and (quick.unreachable or report.evidence.vm_status == "gone"):
            took = time.monotonic() - t0
            self._lost_check_s = took if took > self._lost_check_s else (took + self._lost_check_s) / 2
        row.outcome, row.step, row.attempt = str(outcome), (report.heartbeat or {}).get("step"), n
        decision = policy.decide(outcome, rc.recovery, st.used, time.time(), st.next_try_at, started,
                                 st.failed_tries(n, not monitor.trainer_started(report.attempt, report.heartbeat)),
                                 st.capacity_waits_of(n))
        row.state, row.note = decision.action if decision.action != "none" else "running", decision.reason
        if decision.action == "none" and pending:
            row.note = pending
        if decision.action == "done":
            st.done, st.handled_attempt = True, n
            st.note("completed", attempt=n)
            st.save(store)
            row.state = "completed"
        elif decision.action == "stop":
            row.note = self._stop_held(store, rc, n, outcome, decision, report.diagnosis.reason,
                                       report.incident_key or report.attempt.incident) or row.note
        elif decision.action == "recover":
            row.note = self._recover(store, rc, started, n, outcome)
            fresh = WatchState.load(store) or st
            row.used, row.last = dict(fresh.used), describe(fresh.last)
        return row

    def _verify_interrupted(self, store: RunStore, rc: runconfig.RunConfig, started: float | None,
                            st: WatchState) -> str | None:
        """The resume check of a recovery whose watcher died after the new attempt started (the same
        check as `glue recover`'s, glue.operations.recovery.resume_check), once the attempt passed the plan's step.
        A failed check is a bad restart: the attempt is stopped, an incident recorded, the run stopped
        and `bad_restart` notified. Returns what it waits for, or None."""
        plan = st.resume_plan
        if plan is None:
            return None
        new, upto = plan.new_attempt, plan.upto
        ready, waiting, steps = interrupted.readiness(store, plan)
        if waiting:
            return waiting
        try:
            with lease.held(store, "watch"):
                now_st = WatchState.load(store) or st
                if now_st.resume_plan != st.resume_plan:
                    return None  # another watcher made the check
                now_st.resume_plan = None
                if not ready:  # it failed before the check could be made: handled as any failure
                    now_st.note("recovery_unverified", attempt=new,
                                why=f"attempt {new} ended before step {upto}, where its resume would be checked")
                    now_st.save(store)
                    return None
                self._record_resume_check(store, rc, started, now_st, plan, steps)
                return None
        except GlueError as exc:
            if "is being changed by" in str(exc):
                return f"another controller acts on it: {exc}"
            raise

    def _record_resume_check(self, store: RunStore, rc: runconfig.RunConfig, started: float | None, st: WatchState,
                             plan: ResumePlan, steps: dict[int, dict[str, Any]]) -> None:
        failed, new = plan.failed_attempt, plan.new_attempt
        verdict, record = interrupted.check(store, plan, steps)
        summary = {**recovery_summary(record), "interrupted": True}
        outcome = AttemptClass(plan.failure_class)
        if verdict.ok:
            st.note("recovered", outcome=str(outcome), **summary)
            self.console.print(f"[green]{store.run}[/]: the interrupted recovery's resume checked out on attempt {new}")
            self._event(store, rc, st, "recovered", failed, outcome, recovery=summary)
            st.save(store)
            return
        rejected, trouble = phases.flag_bad_restart(self.home, store, store.read_manifest(), new, verdict)
        noted = {**summary, "problem": verdict.problem, "rejected_checkpoints": rejected, "reject_problem": trouble}
        self._stop_bad_restart(store, rc, st, started, new, noted)

    def _stop_bad_restart(self, store: RunStore, rc: runconfig.RunConfig, st: WatchState, started: float | None,
                          new: int, noted: dict[str, Any]) -> None:
        """A resume that failed its check, whether checked by recover or after a restart: noted with its
        `problem`, and the run stopped as a bad restart."""
        st.note("resume_check_failed", **noted)
        decision = policy.decide(AttemptClass.BAD_RESTART, rc.recovery, st.used, time.time(), st.next_try_at, started)
        rec = store.read_attempt(new)
        self._stop(store, rc, st, new, AttemptClass.BAD_RESTART, decision, str(noted["problem"]),
                   rec.incident if rec else None)

    def _fast_running(self, store: RunStore, rc: runconfig.RunConfig, latest: int) -> Quick:
        """Running when the run plainly runs (no SSH, no log reads); otherwise look closer."""
        closer = Quick(False)
        rec = store.read_attempt(latest)
        if rec is None or len(rec.nodes) > 1 or rec.ended or rec.execution:
            return closer
        beat = store.heartbeat()
        if not beat or beat.get("attempt") != latest or not beat.get("updated_at"):
            return closer
        beat_at = parse_iso(str(beat["updated_at"])).timestamp()
        now = time.time()
        moving = _age_s(beat.get("step_at") or beat.get("started_at"))
        if moving is None or moving > rc.monitor.stall_timeout_seconds or beat.get("held"):
            return closer
        if store.exit_record(latest) is not None:
            return closer
        backend = get_backend(rec.backend, self.home)
        if backend.read_vm(str(rec.vm_id)) is None:
            return closer
        step = beat.get("step")
        running = Quick(True, int(step) if isinstance(step, int) else 0)
        probe_from, decide_at = probe_mod.window(rc.monitor.heartbeat_seconds, rc.monitor.lost_after_seconds,
                                                 1.25 * self._lost_check_s)
        if now - beat_at <= probe_from:  # on time: the connection a late beat's probe asks over is opened now
            self._probes.pop(store.run, None)
            if not self.single_pass:
                probe_mod.hold_for(self.home, records.nodes_of(rec)[0])
            self._wake(beat_at + probe_from)
            return running
        if beat.get("closed"):  # the trainer ended on its own: no beat is due, its exit record is
            if now - beat_at > rc.monitor.stall_timeout_seconds:
                return closer
            self._wake(beat_at + rc.monitor.stall_timeout_seconds)
            return Quick(True, running.step, "the trainer ended; its exit record is still to come")
        if self.single_pass:  # the full check once the heartbeat is older than lost_after (as a probe's answer)
            if now - beat_at > rc.monitor.lost_after_seconds:
                return closer
            return Quick(True, running.step, f"heartbeat {now - beat_at:.1f}s old (lost after "
                                             f"{rc.monitor.lost_after_seconds:g}s)")
        host = current.host_of_node(self.home, records.nodes_of(rec)[0])
        if host is None:  # not in the inventory: the full check says what became of it
            return closer
        probe = self._probes.get(store.run)
        if probe is None or probe.beat_at != beat_at or probe.host.id != host.id:
            # A heartbeat found late only now (the watcher was busy) still gets a whole window.
            deadline = max(beat_at + decide_at, now + decide_at - probe_from)
            probe = self._probes[store.run] = probe_mod.Probe(self.home, host, beat_at, deadline)
        verdict = probe.verdict(now)
        if verdict == "answered":
            # The VM is there. Once the heartbeat is older than lost_after the full check tells running from
            # stall, killed, ...; until then it runs (a full check on every late beat would, on a loaded
            # controller, hold up the polls of the other runs).
            if now - beat_at > rc.monitor.lost_after_seconds:
                return closer
            self._wake(beat_at + rc.monitor.lost_after_seconds)
            return Quick(True, running.step, f"heartbeat {now - beat_at:.1f}s old; {host.name} answers SSH")
        if verdict == "silent":
            return Quick(False, unreachable=frozenset({host.id}))
        self._wake(probe.deadline)
        return Quick(True, running.step, f"heartbeat {now - beat_at:.1f}s old; probing {host.name} over SSH")

    # -- acting ---------------------------------------------------------------------------------
    def _event(self, store: RunStore, rc: runconfig.RunConfig, st: WatchState, kind: str, attempt: int,
               outcome: AttemptClass | str, **detail: Any) -> None:
        """The notice queued and saved in one write with the state it announces, then sent (glue.watch.outbox:
        a watcher killed before it is sent leaves it to the next)."""
        entry = outbox.queue(st, {
            "event": kind, "run": st.run, "attempt": attempt, "class": str(outcome), "at": utc_iso(),
            "used": dict(st.used),
            "budgets": {"preemptions": rc.recovery.max_preemptions, "failures": rc.recovery.max_failures}, **detail})
        st.save(store)
        outbox.deliver(st, rc.notify, entry, self.console)

    def _stop_held(self, store: RunStore, rc: runconfig.RunConfig, n: int, outcome: AttemptClass,
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

    def _stop(self, store: RunStore, rc: runconfig.RunConfig, st: WatchState, n: int, outcome: AttemptClass,
              decision: policy.Decision, reason: str, incident: str | None) -> None:
        st.stopped, st.handled_attempt = decision.reason, n
        if decision.event == "budget_exhausted":
            incident = record_budget_incident(store, st, n, outcome, decision, reason)
        st.note("stopped", attempt=n, outcome=str(outcome), reason=decision.reason, incident=incident)
        self.console.print(f"[red]{store.run}: stopped[/] ({decision.reason})")
        if decision.event:
            self._event(store, rc, st, decision.event, n, outcome, reason=reason, decision=decision.reason,
                        incident=incident)
        st.save(store)

    def _recover(self, store: RunStore, rc: runconfig.RunConfig, started: float | None, n: int,
                 outcome: AttemptClass) -> str:
        try:
            with self.pause(), lease.held(store, "watch"):
                return self._recover_held(store, rc, started, n, outcome)
        except GlueError as exc:
            if "is being changed by" in str(exc):
                return f"another controller acts on it: {exc}"
            raise

    def _recover_held(self, store: RunStore, rc: runconfig.RunConfig, started: float | None, n: int,
                      outcome: AttemptClass) -> str:
        # Decide again under the lease, on the bucket's state: another watcher may have acted meanwhile.
        st = WatchState.load(store) or WatchState(store.run)
        if store.attempts()[-1] != n or st.stopped or st.done:
            return "already handled"
        retry = st.failed_tries(n, not monitor.trainer_started(store.read_attempt(n), store.heartbeat()))
        waits = st.capacity_waits_of(n)
        decision = policy.decide(outcome, rc.recovery, st.used, time.time(), st.next_try_at, started, retry, waits)
        if decision.action != "recover":
            return decision.reason
        st.capacity_waits = waits
        if decision.budget and retry == 0 and not waits:  # a new failure takes one from its budget; a retry does not
            st.used[decision.budget] = st.used.get(decision.budget, 0) + 1
        st.handled_attempt = n
        st.note("recovering", attempt=n, outcome=str(outcome), budget=decision.budget)
        st.save(store)  # counted before it starts: a watcher killed mid-recovery has spent it
        self.console.print(f"[bold]{store.run}[/]: attempt {n} {outcome}: {decision.reason}")
        keep = self.keep_failed or rc.recovery.keep_failed

        def on_started(plan: ResumePlan) -> None:  # a watcher that dies from here on leaves the check to the next
            st.resume_plan = plan
            st.save(store)

        try:
            result = recover_mod.recover_within(self.home, store.run, self.console, rc.recovery.min_nodes,
                                                tolerance=self.tolerance, keep_failed=keep, on_started=on_started)
        except recover_mod.BadRestart as exc:  # recovered, but the resume is wrong: not a failed recovery
            bad = exc.record
            new = bad.new_attempt
            st.resume_plan = None
            self._stop_bad_restart(store, rc, st, started, new, {
                **recovery_summary(bad), "problem": bad.problem, "rejected_checkpoints": bad.rejected_checkpoints,
                "reject_problem": bad.reject_problem})
            return f"attempt {new} failed the resume check: {bad.problem}"
        except NoCapacity as exc:  # the cloud may have a VM later: wait and ask again, not a failed recovery
            wait = st.wait_for_capacity(rc.recovery, n, str(outcome), str(exc), time.time())
            st.save(store)
            self.console.print(f"[yellow]{store.run}: no capacity to recover attempt {n}[/]: {exc} (next try in "
                               f"{wait:.0f}s; not counted as a failed recovery)")
            return f"waiting for capacity: {exc}"
        except GlueError as exc:
            st.resume_plan = None
            st.failed_in_row += 1
            wait = policy.backoff(rc.recovery, st.failed_in_row)
            st.next_try_at = time.time() + wait
            st.note("recovery_failed", attempt=n, outcome=str(outcome), error=str(exc), backoff_s=wait)
            self.console.print(f"[red]{store.run}: recovery of attempt {n} failed[/]: {exc} (next try in {wait:.0f}s)")
            self._event(store, rc, st, "recovery_failed", n, outcome, error=str(exc), backoff_s=wait)
            st.save(store)
            return f"recovery failed: {exc}"
        st.failed_in_row, st.next_try_at, st.resume_plan, st.capacity_waits = 0, 0.0, None, 0
        summary = {**recovery_summary(result), "kept_vm": result.kept_vm, "kept_vms": result.kept_vms}
        st.note("recovered", outcome=str(outcome), **summary)
        self._event(store, rc, st, "recovered", n, outcome, recovery=summary)
        st.save(store)
        return f"recovered onto attempt {result.new_attempt} (verified)"

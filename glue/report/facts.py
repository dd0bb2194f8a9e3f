"""Everything a run recorded in the bucket, gathered once into one typed record for the report, `glue
compare` and `glue budget`. Read-only: nothing here writes to the bucket (docs/design.md §4 is the layout)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from glue.runs.acceptance import Acceptance, evaluations, final_evaluation, judge, recorded_state, thresholds_of
from glue.runs.records import AttemptRecord, Manifest, RecoveryRecord
from glue.runs.store import RunStore, parse_iso

RECOVERY_VM_PHASES = ("provision", "configure", "verify", "prepare")  # the new VM bills from its creation to its start


def when(text: Any) -> datetime | None:
    """A record's UTC timestamp, or None when absent or not in glue's format."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_iso(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class StepPoint:
    step: int
    loss: float
    t: datetime | None


@dataclass
class AttemptFacts:
    n: int
    vm: str | None
    vm_id: str | None
    nodes: int
    started: datetime | None
    ended: datetime | None      # None: still running
    end_source: str             # exit record | last step | attempt record | running
    state: str
    resume: bool
    steps: list[StepPoint] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        end = self.ended or datetime.now(UTC)
        return max(0.0, (end - self.started).total_seconds())


@dataclass(frozen=True)
class CheckpointFacts:
    step: int
    created: datetime | None
    stall_s: float      # what the save cost the training loop (snapshot + wait)
    full_s: float       # serialize + upload + verify, in the background
    bytes: int


@dataclass(frozen=True)
class Gap:
    attempt: int
    after_step: int
    seconds: float


@dataclass
class RunFacts:
    run: str
    manifest: Manifest
    attempts: list[AttemptFacts]
    checkpoints: list[CheckpointFacts]
    recoveries: list[RecoveryRecord]
    incidents: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    acceptance: Acceptance
    drill: dict[str, Any] | None = None
    reference: list[StepPoint] | None = None   # a drill's uninterrupted reference run
    reference_run: str | None = None

    @property
    def backend(self) -> str:
        return str(self.manifest.environment.get("backend") or "local")

    @property
    def gpu_type(self) -> str:
        return str(self.manifest.environment.get("gpu_type") or "none")

    @property
    def gpu_count(self) -> int:
        return int(self.manifest.environment.get("gpu_count") or 0)

    @property
    def interval_steps(self) -> int:
        return int(self.manifest.checkpoint.get("interval_steps") or 1)

    @property
    def final_step(self) -> int | None:
        steps = [p.step for a in self.attempts for p in a.steps]
        return max(steps) if steps else None

    @property
    def final_loss(self) -> float | None:
        latest = self.merged_steps()
        return latest[max(latest)].loss if latest else None

    def merged_steps(self) -> dict[int, StepPoint]:
        """step -> the latest attempt's record of it (a resumed attempt's replayed steps replace the lost ones)."""
        out: dict[int, StepPoint] = {}
        for a in self.attempts:
            out.update({p.step: p for p in a.steps})
        return out

    def wall_s(self) -> float:
        starts = [a.started for a in self.attempts if a.started]
        if not starts:
            return 0.0
        last = self.attempts[-1]
        end = last.ended or datetime.now(UTC)
        return max(0.0, (end - min(starts)).total_seconds())

    def step_seconds(self) -> float | None:
        """Median seconds per step over consecutive steps of each attempt."""
        gaps = [g.seconds for g in self.step_gaps()]
        return statistics.median(gaps) if gaps else None

    def step_gaps(self) -> list[Gap]:
        """Seconds between consecutive steps of each attempt: a long one is a stall or a slow save."""
        out = []
        for a in self.attempts:
            for p, q in zip(a.steps, a.steps[1:], strict=False):
                if p.t and q.t and q.step == p.step + 1:
                    out.append(Gap(a.n, p.step, (q.t - p.t).total_seconds()))
        return out

    def saves(self) -> int:
        """Checkpoints the run took, counted from the steps trained (older ones were pruned from the bucket)."""
        return sum(1 for a in self.attempts for p in a.steps if p.step % self.interval_steps == 0)


def _steps(records: dict[int, dict[str, Any]]) -> list[StepPoint]:
    return [StepPoint(int(s), float(r["loss"]), when(r.get("t"))) for s, r in sorted(records.items())
            if r.get("loss") is not None]


def _attempt(store: RunStore, n: int, steps: list[StepPoint]) -> AttemptFacts:
    rec = store.read_attempt(n) or AttemptRecord.from_dict({"attempt": n, "vm": None})
    exit_rec = store.exit_record(n) or {}
    ended, source = when(exit_rec.get("ended_at")), "exit record"
    state = str(rec.outcome or rec.failure_class or "")
    if ended is None and state:
        # No exit record (a lost VM, a kill): it ran until its last sign of life, not until someone looked.
        ended, source = (steps[-1].t, "last step") if steps and steps[-1].t else (when(rec.ended_at),
                                                                                   "attempt record")
    if ended is None and exit_rec:
        ended, source = when(exit_rec.get("ended_at")), "exit record"
    if not state:
        state = "running" if not exit_rec else ("completed" if exit_rec.get("exit_code") == 0 else "exited")
    if ended is None:
        source = "running"
    return AttemptFacts(n=n, vm=rec.vm, vm_id=rec.vm_id, nodes=len(rec.nodes) or 1,
                        started=when(rec.started_at), ended=ended, end_source=source, state=state,
                        resume=rec.resume, steps=steps)


def _checkpoints(store: RunStore) -> list[CheckpointFacts]:
    out = []
    for step, commit in store.checkpoint_commits().items():
        t = commit.get("timings") or {}
        out.append(CheckpointFacts(
            step=int(commit.get("step", step)),
            created=when(commit.get("created_at")),
            stall_s=float(t.get("snapshot_s", 0)) + float(t.get("wait_s", 0)),
            full_s=sum(float(t.get(k, 0)) for k in ("serialize_s", "upload_s", "verify_s")),
            bytes=int(t.get("bytes") or sum(int(o.get("size", 0)) for objs in (commit.get("components") or {}).values()
                                            for o in objs))))
    return sorted(out, key=lambda c: c.step)


def gather(store: RunStore, state: str | None = None, with_reference: bool = True) -> RunFacts:
    """The run's records. `state`: the monitor's live view of the last attempt, when the caller has it."""
    manifest = store.read_manifest()
    metrics = store.metrics()
    attempts = [_attempt(store, n, _steps(metrics.get(n, {}))) for n in store.attempts()]
    recoveries = store.read_recoveries()
    incidents = store.incidents()
    evals = evaluations(store)
    from glue.runs import monitor

    verdict = judge(state or recorded_state(store), monitor.missing_outputs(store, manifest), thresholds_of(manifest),
                    final_evaluation(evals))
    facts = RunFacts(run=store.run, manifest=manifest, attempts=attempts, checkpoints=_checkpoints(store),
                     recoveries=recoveries, incidents=incidents, evaluations=evals, acceptance=verdict,
                     drill=store.drill())
    if with_reference and facts.drill and facts.drill.get("ref_run"):
        ref = RunStore(store.info, store.creds, str(facts.drill["ref_run"]), refresh=store.refresh)
        merged: dict[int, dict[str, Any]] = {}
        for _, steps in sorted(ref.metrics().items()):
            merged.update(steps)
        facts.reference, facts.reference_run = _steps(merged), ref.run
    return facts

"""A run's verdict: accepted only when it completed, its required outputs are exported, and its final
evaluation meets every threshold in run.yaml's `evaluation.metrics`. Read from the bucket; `judge` is pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from glue.runs import monitor
from glue.runs.records import Manifest
from glue.runs.store import RunStore


@dataclass(frozen=True)
class MetricCheck:
    name: str
    value: float | None
    min: float | None
    max: float | None

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return (self.min is None or self.value >= self.min) and (self.max is None or self.value <= self.max)

    def bounds(self) -> str:
        if self.min is not None and self.max is not None:
            return f"{self.min:g} ≤ x ≤ {self.max:g}"
        return f"≥ {self.min:g}" if self.min is not None else f"≤ {self.max:g}"


@dataclass
class Acceptance:
    """Whether a run is accepted, and why not. Not an attempt's failure class (glue.runs.classify.Diagnosis)."""

    accepted: bool
    state: str
    missing_outputs: list[str]
    metrics: list[MetricCheck]
    evaluation: dict[str, Any] | None
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["metrics"] = [{**asdict(m), "passed": m.passed} for m in self.metrics]
        return out

    def summary(self) -> str:
        return "accepted" if self.accepted else "not accepted: " + "; ".join(self.reasons)


def thresholds_of(manifest: Manifest) -> dict[str, dict[str, float | None]]:
    return dict((manifest.config.get("evaluation") or {}).get("metrics") or {})


def judge(state: str, missing_outputs: list[str], thresholds: dict[str, dict[str, float | None]],
          evaluation: dict[str, Any] | None) -> Acceptance:
    """Completed + outputs exported + every metric of the final evaluation within its thresholds."""
    values = (evaluation or {}).get("metrics") or {}
    checks = [MetricCheck(name, None if values.get(name) is None else float(values[name]), b.get("min"), b.get("max"))
              for name, b in sorted(thresholds.items())]
    reasons = []
    if state != "completed":
        reasons.append(f"the run has not completed (state {state})")
    if missing_outputs:
        reasons.append(f"required outputs missing: {', '.join(missing_outputs)}")
    if not thresholds:
        reasons.append("no acceptance criteria (run.yaml has no evaluation.metrics)")
    elif evaluation is None:
        reasons.append("no evaluation recorded")
    for c in checks:
        if c.value is None and evaluation is not None:
            reasons.append(f"metric {c.name} was not recorded")
        elif c.value is not None and not c.passed:
            reasons.append(f"{c.name} = {c.value:.6g}, needs {c.bounds()}")
    return Acceptance(accepted=not reasons, state=state, missing_outputs=missing_outputs, metrics=checks,
                   evaluation=evaluation, reasons=reasons)


def evaluations(store: RunStore) -> list[dict[str, Any]]:
    """Every recorded evaluation, by attempt then step."""
    return store.evaluations()


def final_evaluation(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation of the run's result: the newest attempt's one marked final, else the one at the highest step."""
    finals = [r for r in records if r.get("final")]
    if finals:
        return max(finals, key=lambda r: (int(r.get("attempt", 0)), int(r.get("step", 0))))
    return max(records, key=lambda r: (int(r.get("step", 0)), int(r.get("attempt", 0)))) if records else None


def recorded_state(store: RunStore) -> str:
    """The last attempt's state as recorded in the bucket (no SSH): what the monitor wrote, else what its exit
    record says."""
    attempts = store.attempts()
    if not attempts:
        return "not started"
    att = store.read_attempt(attempts[-1])
    if att is not None and att.ended:
        return str(att.outcome or att.failure_class)
    exit_rec = store.exit_record(attempts[-1])
    if exit_rec is None:
        return "running"
    return "completed" if exit_rec.get("exit_code") == 0 else f"exited {exit_rec.get('exit_code')}"


def latest_final(store: RunStore) -> dict[str, Any] | None:
    """final_evaluation without reading every record: the newest one marked final is usually the last key
    (`glue status` polls this)."""
    for rec in reversed(store.evaluations(last=3)):
        if rec.get("final"):
            return dict(rec)
    return final_evaluation(store.evaluations())


def run_acceptance(store: RunStore, state: str | None = None) -> Acceptance:
    """The verdict of a run; `state` is the monitor's view when the caller has it (glue status)."""
    manifest = store.read_manifest()
    state = state or recorded_state(store)
    missing = monitor.missing_outputs(store, manifest)
    return judge(state, missing, thresholds_of(manifest), latest_final(store))

"""What the resume check of a started recovery needs (`glue recover` makes the check itself; `glue watch`
keeps the plan in the run's watch state, so a watcher that dies before the check leaves it to the next).

Its JSON is the watch state's `resume_plan`, as written before this type: `to_dict()` writes it, `from_dict()`
reads one back (a key an older watch state lacks reads as empty)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ResumePlan:
    failed_attempt: int
    new_attempt: int
    failure_class: str
    checkpoint_step: int | None
    failure_step: int
    upto: int  # the new attempt's step the check waits for
    world_size: int = 1
    finished_before: bool = False  # the failed attempt had finished training (nothing to replay)
    tolerance: float = 0.0
    started_at: str | None = None  # the new attempt's start: its restore phase is timed from here
    seconds: dict[str, float | None] = field(default_factory=dict)  # the phases timed before the start
    # The check's kind (exact, tolerance, resharded) and its world sizes (Recovery._check_kind).
    resume_check: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ResumePlan:
        values = {k: v for k, v in doc.items() if k in _FIELDS}
        values.update({k: v for k, v in _EMPTY.items() if values.get(k) is None})
        return cls(**values)


_FIELDS = frozenset(f.name for f in fields(ResumePlan))
# Read for a key an older watch state lacks or holds as null (a failure class it did not record: a lost VM).
_EMPTY: dict[str, Any] = {"failure_class": "vm_lost", "failure_step": 0, "world_size": 1, "finished_before": False,
                          "tolerance": 0.0, "seconds": {}, "resume_check": {}}

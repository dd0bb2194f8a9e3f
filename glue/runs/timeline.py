"""Which failure came first across the ranks and nodes of an attempt.

In a group, one rank's failure makes every other rank fail soon after (a closed socket, a collective
timeout), so the loudest error is rarely the cause. The events are ordered by time: the earliest is
the cause, the rest are its consequences. Error files carry the time the exception was caught; a
lost VM is dated by its last sign of life (its ranks' last heartbeat), an exit without an error file
by the supervisor's exit record (both upper bounds, which is what lets a real cause still sort first).
Pure, so it is testable on recorded files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    at: str                 # ISO 8601 UTC, as written by the trainer / supervisor
    kind: str               # error | vm_lost | exit
    summary: str
    node: int | None = None
    vm: str | None = None
    rank: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Event:
        return cls(at=str(raw.get("at", "")), kind=str(raw.get("kind", "")), summary=str(raw.get("summary", "")),
                   node=raw.get("node"), vm=raw.get("vm"), rank=raw.get("rank"))

    def describe(self) -> str:
        who = " ".join(p for p in (f"rank {self.rank}" if self.rank is not None else "",
                                   f"node {self.node}" if self.node is not None else "",
                                   f"({self.vm})" if self.vm else "") if p)
        return f"{self.at} {who}: {self.summary}"


def final_round(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors of the last torchrun restart only: earlier rounds were already handled by a restart."""
    if not errors:
        return []
    last = max(int(e.get("restart") or 0) for e in errors)
    return [e for e in errors if int(e.get("restart") or 0) == last]


def error_event(err: dict[str, Any]) -> Event:
    kind = str(err.get("type", "")).rsplit(".", 1)[-1] or "error"
    first = (str(err.get("message", "")).strip().splitlines() or [""])[0][:200]
    return Event(at=str(err.get("at", "")), kind="error", summary=f"{kind}: {first}" if first else kind,
                 node=err.get("node"), vm=err.get("vm"), rank=err.get("rank"))


def lost_vm_event(node: int, vm: str, last_seen: str, ranks: list[int]) -> Event:
    on = f" (ranks {', '.join(map(str, ranks))})" if ranks else ""
    return Event(at=last_seen, kind="vm_lost", summary=f"VM lost{on}; last sign of life", node=node, vm=vm)


def exit_event(node: int, vm: str, record: dict[str, Any]) -> Event:
    if record.get("oom_kills"):
        what = f"killed by the kernel OOM killer ({record['oom_kills']} oom_kill event(s))"
    elif record.get("signal"):
        what = f"ended by signal {record['signal']}"
    else:
        what = f"exited {record.get('exit_code')} without an error file"
    return Event(at=str(record.get("ended_at", "")), kind="exit", summary=what, node=node, vm=vm)


def order(events: list[Event]) -> list[Event]:
    """Earliest first; at equal times a lost VM or a bare exit precedes the errors it caused."""
    rank_of = {"vm_lost": 0, "exit": 1, "error": 2}
    return sorted(events, key=lambda e: (e.at or "~", rank_of.get(e.kind, 3), e.rank if e.rank is not None else -1))

"""`glue advise`: the checkpoint interval from the run's own measured costs and failure history.

  C  save cost: what a checkpoint costs the training loop (async: the snapshot stall); a full save
     (serialize + upload + verify) bounds the interval from below, since one save is in flight at a time
  R  restore cost: measured by `glue recover` (trainer start -> first resumed step)
  M  mean time between failures: --mtbf, else the run's attempts' wall time / recoverable failures
Young: T = sqrt(2 C M). Daly (C not small against M): T = sqrt(2CM)(1 + sqrt(C/2M)/3 + (C/2M)/9) - C.
Expected work lost per failure ~ T/2 + R; expected overhead of an interval T ~ C/T + (T/2 + R)/M.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from glue.errors import GlueError
from glue.runs.class_policy import POLICIES
from glue.runs.store import RunStore, parse_iso

# The failures a restart repairs (a string set: attempt records keep the class as its value).
RECOVERABLE = frozenset(str(cls) for cls, policy in POLICIES.items() if policy.recoverable)


def young(c: float, m: float) -> float:
    return math.sqrt(2 * c * m)


def daly(c: float, m: float) -> float:
    if c >= 2 * m:
        return m
    r = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c


def expected_loss(t: float, r: float) -> float:
    """Work lost per failure: on average half an interval is replayed, plus the restore."""
    return t / 2 + r


def overhead(t: float, c: float, r: float, m: float) -> float:
    """Fraction of wall time spent checkpointing and recovering at interval t."""
    return c / t + expected_loss(t, r) / m


@dataclass
class Measured:
    save_stall_s: float
    save_full_s: float
    restore_s: float | None
    step_s: float | None
    interval_steps: int
    failures: int
    wall_s: float
    saves: int


def measure(store: RunStore) -> Measured:
    manifest = store.read_manifest()
    stalls, fulls = [], []
    for commit in store.checkpoint_commits().values():
        t = commit.get("timings", {})
        stalls.append(float(t.get("snapshot_s", 0)) + float(t.get("wait_s", 0)))
        fulls.append(sum(float(t.get(k, 0)) for k in ("serialize_s", "upload_s", "verify_s")))
    restores = [float(restore) for r in store.read_recoveries() if (restore := r.seconds.get("restore")) is not None]
    step_gaps: list[float] = []
    for steps in store.metrics().values():
        ordered = sorted(steps.items())
        step_gaps += [(parse_iso(b["t"]) - parse_iso(a["t"])).total_seconds()
                      for (sa, a), (sb, b) in itertools.pairwise(ordered) if sb == sa + 1]
    failures, wall = 0, 0.0
    for n in store.attempts():
        att = store.read_attempt(n)
        if att is None:
            continue
        if att.failure_class in RECOVERABLE:
            failures += 1
        if att.started_at:
            end = parse_iso(att.ended_at) if att.ended_at else datetime.now(UTC)
            wall += (end - parse_iso(att.started_at)).total_seconds()
    return Measured(
        save_stall_s=statistics.mean(stalls) if stalls else 0.0,
        save_full_s=statistics.mean(fulls) if fulls else 0.0,
        restore_s=statistics.mean(restores) if restores else None,
        step_s=statistics.median(step_gaps) if step_gaps else None,
        interval_steps=int(manifest.checkpoint["interval_steps"]),
        failures=failures, wall_s=wall, saves=len(stalls),
    )


def mtbf_of(run: str, m: Measured, mtbf_hours: float | None) -> tuple[float, str]:
    """Mean time between failures in seconds, and where it came from: given, or measured on the run."""
    if mtbf_hours is not None:
        return mtbf_hours * 3600, "given (--mtbf)"
    if m.failures:
        return m.wall_s / m.failures, f"measured: {m.failures} failure(s) in {m.wall_s / 3600:.3f} h"
    raise GlueError(f"run {run} has no recorded failures to estimate MTBF from; pass --mtbf HOURS "
                    "(for rented GPU VMs, 24-200 h is typical)")


def advise(store: RunStore, mtbf_hours: float | None, restore_s: float | None) -> dict[str, Any]:
    m = measure(store)
    if m.saves == 0:
        raise GlueError(f"run {store.run} has no committed checkpoint yet, so no measured save cost; "
                        "let it checkpoint at least once")
    mtbf, mtbf_src = mtbf_of(store.run, m, mtbf_hours)
    r = restore_s if restore_s is not None else m.restore_s
    r_src = "given (--restore-seconds)" if restore_s is not None else "measured by glue recover"
    if r is None:
        raise GlueError(f"run {store.run} has no measured restore yet (no `glue recover`); pass --restore-seconds")
    c = max(m.save_stall_s, 1e-3)
    floor = m.save_full_s  # one save in flight: a shorter interval only queues saves
    options: dict[str, float] = {"young": max(young(c, mtbf), floor), "daly": max(daly(c, mtbf), floor)}
    if m.step_s:
        options = {"current": m.interval_steps * m.step_s, **options}
    rows = {
        name: {"interval_s": t, "interval_steps": round(t / m.step_s) if m.step_s else None,
               "expected_loss_per_failure_s": expected_loss(t, r), "overhead_pct": 100 * overhead(t, c, r, mtbf),
               "checkpoint_overhead_pct": 100 * c / t}
        for name, t in options.items()
    }
    return {
        "run": store.run, "save_stall_s": m.save_stall_s, "save_full_s": m.save_full_s, "restore_s": r,
        "restore_source": r_src, "mtbf_s": mtbf, "mtbf_source": mtbf_src, "step_s": m.step_s,
        "saves_measured": m.saves, "options": rows,
    }


def worked_example_numbers() -> dict[str, float]:
    """The case from the design notes: failure at minute 95, last checkpoint at 90, restore 5 minutes;
    Young's and Daly's intervals for a 30 s save and a 24 h MTBF."""
    fail, last, restore = 95, 90, 5
    return {"failure_minute": fail, "last_checkpoint_minute": last, "restore_minutes": restore,
            "replay_minutes": fail - last, "lost_minutes": fail - last + restore,
            "save_cost_s": 30, "mtbf_s": 86400,
            "young_interval_minutes": round(young(30, 86400) / 60, 1),
            "daly_interval_minutes": round(daly(30, 86400) / 60, 1)}


def worked_example() -> list[str]:
    """The case from the design notes, spelled out."""
    n = worked_example_numbers()
    fail, last, restore = n["failure_minute"], n["last_checkpoint_minute"], n["restore_minutes"]
    return [
        f"failure at minute {fail}; last complete checkpoint at minute {last}; restore takes {restore} minutes",
        f"  replay:  {fail} - {last} = {n['replay_minutes']} minutes of training redone",
        f"  restore: {restore} minutes to provision, load and resume",
        f"  lost:    {n['replay_minutes']} + {restore} = {n['lost_minutes']} minutes",
        "on average a failure lands mid-interval, so expect T/2 + R lost per failure (T = interval, R = restore);",
        "Young's interval T = sqrt(2·C·MTBF) balances that against the save cost C",
        f"  e.g. C = 30 s, MTBF = 24 h: T = sqrt(2·30·86400) = {n['young_interval_minutes']:.0f} min "
        f"(Daly: {n['daly_interval_minutes']:.0f} min)",
    ]

"""`glue compare A B`: two runs side by side, judged on the same evaluation set or not at all."""

from __future__ import annotations

from typing import Any

from glue.errors import GlueError
from glue.report.cost import resources
from glue.report.facts import RunFacts


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def eval_set(f: RunFacts) -> str | None:
    """The pinned evaluation set's sha256 (None: the trainer's own, none pinned)."""
    pin = f.manifest.evaluation.get("dataset") or {}
    return pin.get("sha256") or None


def check_same_eval_set(a: RunFacts, b: RunFacts) -> None:
    sa, sb = eval_set(a), eval_set(b)
    if sa != sb:
        def name(s: str | None) -> str:
            return f"sha256 {s[:12]}…" if s else "no pinned set"
        raise GlueError(f"refusing to compare {a.run} and {b.run}: they were evaluated on different sets "
                        f"({a.run}: {name(sa)}, {b.run}: {name(sb)}); compare runs evaluated on the same pinned set")


def config_diff(a: RunFacts, b: RunFacts) -> list[dict[str, Any]]:
    """run.yaml keys whose values differ (run-specific locations aside)."""
    fa, fb = flatten(a.manifest.config), flatten(b.manifest.config)
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va != vb:
            if isinstance(va, str) and isinstance(vb, str) and va.replace(a.run, "{run}") == vb.replace(b.run, "{run}"):
                continue  # s3://…/runs/A vs …/runs/B: the same setting
            out.append({"key": key, "a": va, "b": vb})
    return out


def side(f: RunFacts) -> dict[str, Any]:
    r = resources(f)
    m = f.manifest
    return {
        "run": f.run, "code": (m.code or {}).get("git_sha"), "dirty": (m.code or {}).get("dirty"),
        "workdir_sha256": (m.workdir or {}).get("sha256"),  # the user's code (None: a bundled example)
        "input": m.input, "image": m.image, "image_digest": m.image_digest,
        "eval_set": eval_set(f), "state": f.acceptance.state, "accepted": f.acceptance.accepted,
        "metrics": {c.name: {"value": c.value, "min": c.min, "max": c.max, "passed": c.passed}
                    for c in f.acceptance.metrics},
        "final_loss": f.final_loss, "steps": f.final_step, "wall_s": f.wall_s(), "vm_hours": r.vm_hours,
        "gpu_hours": r.gpu_hours, "cost": r.cost, "currency": r.price.currency, "recoveries": len(f.recoveries),
        "attempts": len(f.attempts),
    }


def compare(a: RunFacts, b: RunFacts) -> dict[str, Any]:
    check_same_eval_set(a, b)
    return {"a": side(a), "b": side(b), "config_diff": config_diff(a, b)}

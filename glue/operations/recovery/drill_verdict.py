"""glue drill's verdict: a recovery that lost state, told from a job that does not repeat itself.

A difference between the drill run and its reference that already shows before the drill run's VM was
lost (a loss of its first attempt: step 1, or any step before the VM died) cannot come from the recovery:
the job is nondeterministic, and a drill cannot prove its recovery. That is its own verdict, naming the
random streams that differ and the fix. "lost: ..." is kept for differences that start after the resume.
A random stream that differs at the end although every loss agreed is one no step depended on (unseeded,
never drawn from): a warning about seeding, not a failed recovery.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from glue.operations.recovery.checkpoint_diff import Comparison
from glue.operations.recovery.resume_check import STEP_INPUTS, losses_agree

DETERMINISM = "torch.use_deterministic_algorithms(True)"
SEED_ALL = "torch.manual_seed(0), np.random.seed(0), random.seed(0)"
# A stream's name in a checkpoint path -> the call that seeds it (first match wins: "numpy" before "torch").
_SEEDS = (("numpy", "np.random.seed(0)"), ("python", "random.seed(0)"), ("cuda", "torch.manual_seed(0)"),
          ("torch", "torch.manual_seed(0)"), ("cpu", "torch.manual_seed(0)"),
          ("generator", "torch.Generator().manual_seed(0)"))


@dataclass
class Early:
    """The first step at which the drill run's first attempt (before its VM was lost) differs from the reference."""

    step: int
    inputs: list[str] = field(default_factory=list)  # the step inputs that differ there (STEP_INPUTS' names)


def seed_call(where: str) -> str:
    """The call that seeds the stream a checkpoint path names (`rng.rank0.numpy` -> np.random.seed(0))."""
    low = where.lower()
    return next((call for token, call in _SEEDS if re.search(rf"\b{token}\b|_{token}|{token}_", low)
                 or low.endswith(token)), SEED_ALL)


def before_loss(ref: dict[int, dict[str, Any]], first_attempt: dict[int, dict[str, Any]],
                tolerance: float) -> Early | None:
    """The first step the drill run's first attempt ran whose loss differs from the reference's."""
    for step in sorted(first_attempt):
        a, b = ref.get(step), first_attempt[step]
        if a is None or losses_agree(float(a["loss"]), float(b["loss"]), tolerance):
            continue
        lost = [n for k, n in STEP_INPUTS.items() if k in a and a[k] != b.get(k)]
        return Early(step, lost)
    return None


def nondeterminism(early: Early, final: Comparison | None) -> str:
    """The verdict's line for a job that differs from its reference before anything was lost."""
    inputs = f" (step inputs that differ: {', '.join(early.inputs)})" if early.inputs else ""
    head = (f"not reproducible: the drill run's loss at step {early.step} already differs from the reference's, "
            f"before its VM was lost{inputs}, so the recovery cannot be proven")
    streams = [d.where for d in (final.differences if final else []) if d.rng]
    if streams:
        fixes = sorted({seed_call(s) for s in streams})
        return (f"{head}; random streams that differ: {', '.join(streams[:4])}: seed them ({', '.join(fixes)}), "
                f"and if it still differs, {DETERMINISM}")
    tensor = next((d.where for d in (final.differences if final else [])), None)
    at = f" (first differing tensor at the end: {tensor})" if tensor else ""
    return (f"{head}; no random stream differs{at}: seed every stream ({SEED_ALL}) and make the computation "
            f"deterministic ({DETERMINISM})")


def rng_warnings(final: Comparison) -> list[str]:
    """A random stream that differs at the end of two runs whose every loss agreed: no step depended on it."""
    return [f"{d.where} differs from the reference although every loss agreed: a random stream no step drew "
            f"from, left unseeded; seed it ({seed_call(d.where)}) so that a drill compares it too"
            for d in final.differences if d.rng]

"""A small text corpus generated deterministically (no download): sentences from a tiny grammar."""

from __future__ import annotations

import random

SUBJECTS = ["the engineer", "a student", "the model", "our cluster", "the old server", "a tired researcher",
            "the scheduler", "every worker", "the bucket", "a checkpoint"]
VERBS = ["trains", "watches", "restarts", "loads", "saves", "recovers", "measures", "writes", "reads", "loses"]
OBJECTS = ["the weights", "a new batch", "the optimizer state", "its last step", "the loss curve",
           "a fresh machine", "the data loader", "every gradient", "the random seed", "the log file"]
ENDINGS = ["before dawn", "after the crash", "without a word", "at minute ninety five", "again and again",
           "on a rented machine", "in the cold room", "while the fans spin", "exactly once", "for hours"]


def generate(chars: int = 200_000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < chars:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}.\n"
        parts.append(s)
        total += len(s)
    return "".join(parts)[:chars]

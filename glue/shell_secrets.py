"""A run's `secrets:` (names in run.yaml) and their values from the shell glue runs in: read wherever an
attempt, a trial or a job gets them (deploy, recovery, memprobe, a resubmitted Slurm job, a Lyceum
execution), with one line naming every missing one and what to run again once exported."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from glue.errors import GlueError


def from_shell(names: Iterable[str], then: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{name: value} of every secret. `then`: what to do once exported ("deploy again"). An empty value counts as
    missing (a trainer given an empty key fails later, far from the cause)."""
    source = os.environ if environ is None else environ
    wanted = list(names)
    missing = [name for name in wanted if not source.get(name)]
    if missing:
        many = len(missing) > 1
        raise GlueError(f"secret{'s' if many else ''} {', '.join(missing)} {'are' if many else 'is'} not set in this "
                        f"shell's environment (run.yaml's `secrets:`): export {'them' if many else 'it'} and {then} "
                        "(values are handed to the trainer in a 0600 file, never stored)")
    return {name: source[name] for name in wanted}

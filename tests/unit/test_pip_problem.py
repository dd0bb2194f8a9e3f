"""pip's reason as the one line a user reads: a project with a long history is not kilobytes of versions."""
from __future__ import annotations

import subprocess

from glue.train.workspace.venv import pip_problem


def _failed(stderr: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], 1, "", stderr)


def test_an_unresolvable_pin_names_the_newest_versions_only() -> None:
    versions = ", ".join(f"4.{i}.0" for i in range(120))
    line = pip_problem(_failed("ERROR: Could not find a version that satisfies the requirement tqdm==99.0.0 "
                               f"(from versions: {versions})\nERROR: No matching distribution found for tqdm==99\n"))
    assert line == ("Could not find a version that satisfies the requirement tqdm==99.0.0 "
                    "(from versions: …, 4.115.0, 4.116.0, 4.117.0, 4.118.0, 4.119.0; 120 in all)")


def test_a_short_list_and_other_reasons_are_kept_as_pip_said_them() -> None:
    short = "Could not find a version that satisfies the requirement x==2 (from versions: 1.0, 1.1)"
    assert pip_problem(_failed(f"ERROR: {short}\n")) == short
    assert pip_problem(_failed("some warning\nERROR: ResolutionImpossible: a conflict\n")) == \
        "ResolutionImpossible: a conflict"

"""A run's `secrets:` read from the shell: every missing one named in one line with what to run again (deploy,
recovery, memprobe, a resubmitted Slurm job and a Lyceum execution all read them so), an empty value missing."""

from __future__ import annotations

import pytest

from glue.errors import GlueError
from glue.shell_secrets import from_shell


def test_the_values_of_every_secret() -> None:
    assert from_shell(("A", "B"), "deploy again", {"A": "1", "B": "2", "C": "3"}) == {"A": "1", "B": "2"}
    assert from_shell((), "deploy again", {}) == {}


@pytest.mark.parametrize(("environ", "said"), [
    ({"A": "1"}, "secret B is not set in this shell's environment (run.yaml's `secrets:`): export it and deploy "
                 "again"),
    ({"A": "1", "B": ""}, "secret B is not set"),  # empty: a trainer given an empty key fails far from the cause
    ({}, "secrets A, B are not set in this shell's environment (run.yaml's `secrets:`): export them and deploy"),
])
def test_missing_secrets_are_one_line_naming_each(environ: dict[str, str], said: str) -> None:
    with pytest.raises(GlueError) as err:
        from_shell(("A", "B"), "deploy again", environ)
    assert said in str(err.value) and "\n" not in str(err.value)
    assert "1" not in str(err.value)  # no value is ever shown

"""The scale gate's "same code": a run that ships a workdir is validated by smaller runs of the same
package (the user's code), whatever gpukit's commit; a run without one by gpukit's commit."""

from typing import Any

from glue.runs import gate
from glue.runs.records import Manifest


def _same_code(doc: dict[str, Any], git_sha: str | None, workdir_sha256: str | None) -> bool:
    return gate._same_code(Manifest.from_dict(doc), git_sha, workdir_sha256)


def test_same_code_is_the_workdir_package_when_there_is_one() -> None:
    mine = {"workdir": {"sha256": "a" * 64}, "code": {"git_sha": "g1"}}
    assert _same_code(mine, "g2", "a" * 64)               # gpukit moved on: the user's code is the same
    assert not _same_code(mine, "g1", "b" * 64)           # same gpukit, other user code
    assert not _same_code({"code": {"git_sha": "g1"}}, "g1", "a" * 64)   # tiny_gpt does not validate a package
    assert _same_code({"code": {"git_sha": "g1"}}, "g1", None)
    assert not _same_code(mine, "g1", None)               # a package run does not validate a run without one

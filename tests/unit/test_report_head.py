"""The report's head says what ran: the user's workdir by content hash (gpukit's own commit is not the
user's code), and an input only when run.yaml pins one (never 'None None')."""
from __future__ import annotations

from glue.report.html import code_line, input_line


def test_a_workdir_run_is_named_by_its_package_hash_and_repository_commit() -> None:
    workdir = {"sha256": "928aeb" + "0" * 58, "files": 3, "path": "/tmp/myjob",
               "git": {"commit": "abc123", "dirty": True}}
    line = code_line(workdir, {"git_sha": "09956a1d", "dirty": False})
    assert line.startswith("workdir /tmp/myjob sha256 928aeb0000000000… (3 files, commit abc123 (dirty))")
    assert line.endswith("; gpukit 09956a1d")
    no_git = code_line({**workdir, "git": {"commit": None}}, {})
    assert "commit" not in no_git and "(3 files)" in no_git


def test_a_bundled_example_is_named_by_gpukits_commit() -> None:
    assert code_line(None, {"git_sha": "09956a1d", "dirty": True}) == "gpukit 09956a1d (dirty)"


def test_the_input_is_named_only_when_pinned() -> None:
    assert input_line(None) == input_line({"uri": None, "version": None}) == "none pinned in run.yaml (input:)"
    assert input_line({"uri": "s3://b/data", "version": "v3"}) == "s3://b/data version v3"
    assert input_line({"uri": "s3://b/data"}) == "s3://b/data"

"""tests/lint_vm_python.py (make lint): what it counts as the VM side, and that it fails on a 3.11-only
standard-library module, a module gone in 3.12, a VM-side file outside ruff's py310 patterns and a 3.11-only
API (mypy as Python 3.10)."""

from __future__ import annotations

from pathlib import Path

from tests import lint_vm_python as lint

ROOT = Path(__file__).resolve().parents[2]


def test_the_vm_side_is_what_runs_there_and_not_the_controller() -> None:
    files = lint.vm_side()
    assert {"glue.train.run.supervise", "glue.train.workspace.__main__", "glue.train.checkpoint.check",
            "glue.examples.tiny_gpt", "glue.memprobe.vm_trial", "glue.memprobe.runner", "glue.launch"} <= set(files)
    assert not {"glue.cli", "glue.commands", "glue.runs", "glue.operations"} & set(files)
    assert lint.ruff_coverage_problems(files) == []


def test_newer_and_removed_stdlib_modules_are_named(tmp_path: Path) -> None:
    code = tmp_path / "vm_code.py"
    code.write_text("import tomllib\nfrom distutils import util\nimport json\nfrom datetime import datetime\n")
    problems = lint.stdlib_problems({"vm_code": code})
    assert len(problems) == 2, problems
    assert "imports tomllib, which Python has only in 3.11-" in problems[0]
    assert "imports distutils, which Python has only in 3.0-3.11" in problems[1]


def test_a_vm_file_outside_the_py310_patterns_is_named() -> None:
    problems = lint.ruff_coverage_problems({"glue.cli": ROOT / "glue" / "cli.py"})
    assert problems == ["glue/cli.py runs on the VM but no [tool.ruff] per-file-target-version pattern sets it "
                        "to py310: add it there"]


def test_a_311_only_api_fails_mypy_as_310(tmp_path: Path) -> None:
    code = tmp_path / "vm_api.py"
    code.write_text("from datetime import UTC, datetime\n\n\ndef now() -> datetime:\n    return datetime.now(UTC)\n")
    problems = lint.mypy_problems({"vm_api": code})
    assert any('Module "datetime" has no attribute "UTC"' in p and "(as Python 3.10)" in p for p in problems), problems
    assert not any("(as Python 3.12)" in p for p in problems), problems

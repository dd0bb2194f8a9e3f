"""The command a hint prints for glue must work when pasted into another shell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from glue.paths import PROJECT_ROOT, glue_command

VENV_GLUE = Path(sys.prefix) / "bin" / "glue"


def test_glue_is_named_as_it_can_be_typed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv not on PATH: its glue, by path
    monkeypatch.chdir(PROJECT_ROOT)
    if VENV_GLUE.is_relative_to(PROJECT_ROOT):
        assert glue_command() == str(VENV_GLUE.relative_to(PROJECT_ROOT))  # .venv/bin/glue in the project
    monkeypatch.chdir(tmp_path)
    assert glue_command() == str(VENV_GLUE)  # elsewhere: the whole path
    monkeypatch.setenv("PATH", f"{VENV_GLUE.parent}:/usr/bin:/bin")
    assert glue_command() == "glue"  # on PATH: as it is

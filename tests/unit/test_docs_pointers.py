"""Every place glue points the user into the docs (a message, a --help text, a docstring that becomes a
schema description) names a page that exists, and `glue --help` ends with the line that links the docs."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from glue.cli import DOCS_LINE, cli

ROOT = Path(__file__).resolve().parents[2]
POINTER = re.compile(r"\bdocs/[\w./-]*\w\.(?:md|json)\b")
# Pages other engineers are writing now, already named by code they committed: a pointer to one is let
# through until the page lands (then it must exist like any other). Empty this set once they have.
PENDING: set[str] = set()


def _glue_sources() -> list[Path]:
    return sorted(p for p in (ROOT / "glue").rglob("*.py") if "__pycache__" not in p.parts)


def test_every_docs_path_glue_names_exists() -> None:
    missing = [f"{p.relative_to(ROOT)}: {ref}" for p in _glue_sources()
               for ref in POINTER.findall(p.read_text()) if not (ROOT / ref).is_file() and ref not in PENDING]
    assert not missing, f"glue points at docs that do not exist: {missing}"


def test_glue_points_to_no_readme_section() -> None:
    """The README is a short front page; detail lives in docs pages, which is where glue points."""
    sections = [f"{p.relative_to(ROOT)}:{n}" for p in _glue_sources()
                for n, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"README['\"]? (section|\"|')|see (the )?README|README's", line)]
    assert not sections, f"pointers to README sections (point to a docs/ page instead): {sections}"


def test_glue_help_ends_with_the_docs_line() -> None:
    result = CliRunner().invoke(cli, ["--help"], prog_name="glue")
    assert result.exit_code == 0
    assert result.output.rstrip().splitlines()[-1].strip() == DOCS_LINE
    for ref in POINTER.findall(DOCS_LINE):
        assert (ROOT / ref).is_file(), ref

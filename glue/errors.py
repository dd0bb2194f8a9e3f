"""The one exception type the CLI turns into a single clear line and a non-zero exit."""

from __future__ import annotations


class GlueError(Exception):
    """A problem the user can fix: the message says what is wrong and how to fix it."""

    exit_code = 1


def yaml_problem(exc: Exception) -> str:
    """Where a YAML parser stopped and why, for a one-line error: " at line L, column C: <problem>"."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["?"])[0]
    return f"{where}: {problem}"

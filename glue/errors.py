"""The one exception type the CLI turns into a single clear line and a non-zero exit (and its kinds)."""

from __future__ import annotations


class GlueError(Exception):
    """A problem the user can fix: the message says what is wrong and how to fix it."""

    exit_code = 1


class NoCapacity(GlueError):
    """The cloud has no free VM of the kind asked for right now: asking again later may work (so `glue watch`
    waits and retries instead of counting a failed recovery). Every backend's message says "no capacity",
    which is how the error is known again after it crossed terraform (a provider diagnostic)."""

    MARKER = "no capacity"

    @classmethod
    def said_in(cls, text: str) -> bool:
        return cls.MARKER in text.lower()


def yaml_problem(exc: Exception) -> str:
    """Where a YAML parser stopped and why, for a one-line error: " at line L, column C: <problem>"."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["?"])[0]
    return f"{where}: {problem}"

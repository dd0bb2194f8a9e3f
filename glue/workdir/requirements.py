"""The run's `requirements:` read on the controller: a file in the workdir or a list, as pip lines.

Checked before any VM work: includes (-r, -c) and editable or local-path requirements are refused
(code in the workdir is importable as is: it is the trainer's cwd and on PYTHONPATH).
"""

from __future__ import annotations

import re
from pathlib import Path

from glue.errors import GlueError

# Options that say where packages come from: passed to pip as they are.
INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--no-index", "--find-links", "-f", "--trusted-host",
                 "--pre", "--only-binary", "--prefer-binary")
REFUSED_OPTIONS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable")
LOCAL = re.compile(r"^(\.{1,2}/|/|~|file:)")


def _check(line: str, where: str) -> str:
    opt = line.split()[0].split("=", 1)[0]
    if line.startswith("-"):
        if opt in REFUSED_OPTIONS:
            raise GlueError(f"requirements ({where}): {line!r} is not supported; list every requirement in one "
                            "file (code in the workdir needs no install: it is on PYTHONPATH)")
        if opt not in INDEX_OPTIONS:
            raise GlueError(f"requirements ({where}): unknown option {opt!r}; allowed: {', '.join(INDEX_OPTIONS)}")
        return line
    if LOCAL.match(line):
        raise GlueError(f"requirements ({where}): {line!r} is a local path; code in the workdir is importable "
                        "as is (it is the trainer's cwd and on PYTHONPATH): list packages from an index or URL")
    return line


def lines_of(spec: str | tuple[str, ...] | None, workdir: Path | None, shipped: set[str]) -> list[str]:
    """The requirement lines (comments and blanks dropped, each checked)."""
    if spec is None:
        return []
    if isinstance(spec, tuple):
        return [_check(s.strip(), "run config") for s in spec if s.strip()]
    if workdir is None:
        raise GlueError(f"requirements: {spec} is a file in the workdir, but the run has no `workdir:`; set one, "
                        "or give the requirements as a list")
    rel = Path(spec).as_posix().removeprefix("./")
    path = workdir / rel
    if not path.is_file():
        raise GlueError(f"requirements file {path} does not exist; fix `requirements:` (a path relative to the "
                        "workdir) or give a list")
    if rel not in shipped:
        raise GlueError(f"requirements file {rel} is ignored by the workdir's ignore files; it must ship with the code")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise GlueError(f"cannot read requirements file {path}: {exc}") from exc
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line:
            out.append(_check(line, rel))
    return out

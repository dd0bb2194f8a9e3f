"""`make lint`: no bucket key is spelled outside glue/train/layout.py, the one module that names them.

    python -m tests.lint_bucket_keys [PATH ...]     (default: glue and bench)

Every string literal in the Python files under PATH (docstrings aside; an f-string's text with its
placeholders) is checked against the names layout defines (layout.KEY_SEGMENTS, layout.KEY_FILES):

- a key segment spelled as one, `<segment>/` at a path boundary (`"incidents/"`, `f"runs/{run}/"`,
  `"s3://b/ckpt/step-1"`, `" under ckpt-invalid/"`);
- a key file name as the whole literal or one whole part of an f-string (`"manifest.json"`,
  `f"{prefix}manifest.json"`), or after a `/` (`"ckpt/step-1/COMMIT.json"`, `"/COMMIT.json"`).

Prose that names a file ("COMMIT.json is missing") is not a key. Each finding is printed as
`file:line: ...`; the exit status is 1 when there is one, or when an entry of ALLOWED no longer matches.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from glue.train import layout

ROOT = Path(__file__).resolve().parents[1]
OWNER = "glue/train/layout.py"
# What `make lint` checks: the product, and the benches (a key spelled by hand there measures a layout that
# may no longer be the product's). tests/ is not in yet: many of its files still spell keys by hand.
DEFAULT = (ROOT / "glue", ROOT / "bench")
MARK = "\x00"  # an f-string placeholder in the text checked
_NAME = r"A-Za-z0-9_.\-"

# Keys still spelled by hand in files another engineer is changing (issue 33): allowed, temporarily and
# exactly, as (file, the literal as this checker shows it, placeholders as {}). Remove an entry once its
# file builds the key through glue.train.layout / RunStore; an entry that matches nothing fails the check.
ALLOWED: frozenset[tuple[str, str]] = frozenset({
})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    text: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} in {self.text!r}: build it with glue.train.layout"


def _segment_res() -> list[tuple[str, re.Pattern[str]]]:
    out = []
    for seg in layout.KEY_SEGMENTS:
        s = re.escape(seg)
        out.append((f"key segment {seg}/", re.compile(rf"(?:^|(?<=[^{_NAME}])){s}/")))
    return out


def _file_res() -> list[tuple[str, str, re.Pattern[str]]]:
    return [(f"key {name}", name, re.compile(rf"/{re.escape(name)}(?=$|[^{_NAME}])")) for name in layout.KEY_FILES]


SEGMENTS, FILES = _segment_res(), _file_res()


def key_problems(text: str) -> list[str]:
    """What in one literal's text (placeholders as MARK) spells a bucket key."""
    found = [what for what, rx in SEGMENTS if rx.search(text)]
    parts = text.split(MARK)
    found += [what for what, name, rx in FILES if name in parts or rx.search(text)]
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    """Bare string statements: module, class and function docstrings, and other prose blocks."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal but docstrings; an f-string once, placeholders as MARK."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):  # breadth first: an f-string before the constants inside it
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in ast.walk(node) if v is not node)
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else MARK for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def check_source(source: str, path: str) -> list[Finding]:
    tree = ast.parse(source, filename=path)
    return [Finding(path, line, text.replace(MARK, "{}"), what)
            for line, text in literals(tree) for what in key_problems(text)]


def check(paths: list[Path], allowed: frozenset[tuple[str, str]] = ALLOWED) -> tuple[list[Finding], list[str]]:
    """(findings not allowed, allow-list entries that matched nothing) for the .py files under paths."""
    findings: list[Finding] = []
    for top in paths:
        for file in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            rel = file.resolve().relative_to(ROOT).as_posix() if file.resolve().is_relative_to(ROOT) else str(file)
            if rel == OWNER:
                continue
            findings += check_source(file.read_text(), rel)
    used = {(f.path, f.text) for f in findings} & allowed
    stale = sorted(f"{p}: {t!r}" for p, t in allowed - used if any(_covers(top, p) for top in paths))
    return [f for f in findings if (f.path, f.text) not in allowed], stale


def _covers(top: Path, rel: str) -> bool:
    base = top.resolve()
    target = ROOT / rel
    return target == base or target.is_relative_to(base)


def main(argv: list[str]) -> int:
    findings, stale = check([Path(a) for a in argv] or list(DEFAULT))
    for f in findings:
        print(f)
    for entry in stale:
        print(f"tests/lint_bucket_keys.py: allow-list entry {entry} matches nothing any more: remove it")
    if findings:
        print(f"lint: bucket keys are built in {OWNER} only (and read and written through RunStore)")
    return 1 if findings or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

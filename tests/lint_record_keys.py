"""`make lint`: glue/ reads the run's records through their types (glue/runs/records.py), never by key.

    python -m tests.lint_record_keys [PATH ...]     (default: glue)

The manifest, the attempt records and the recovery records are read as Manifest, AttemptRecord and
RecoveryRecord (RunStore.read_manifest, read_attempt, latest_attempt, read_recoveries), an attempt's nodes
as AttemptNode (`record.nodes`, `records.nodes_of(attempt)`): a field read is an attribute, which mypy
checks. What this lint finds in the Python files under PATH, outside the records' own modules
(glue/runs/records.py, glue/runs/store.py):

- a call of the store's readers of the JSON as stored (`.manifest()`, `.attempt(n)`, `.recoveries()`,
  `.find_manifest()`): they are for what checks the bucket itself (tests), not for glue;
- a record's key read by string: `x["key"]`, `x.get("key")`, `x.setdefault("key", ...)`, `x.pop("key")` where
  `x` is named as a record (`manifest`, `attempt`, `rec`, `prev`, `started`, ...) or as an attempt's node
  (`nd`, `node`, `head`, `n`, `lost_node`, or an entry `x.nodes[k]`, `nodes_of(x)[k]`) and `key` is one of
  the records' fields (or a node's);
- a key read out of a record's `extra` (a key the record type does not know: make it a field) or out of its
  `to_dict()` (read the attribute).

Each finding is printed as `file:line: ...`; the exit status is 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from glue.runs.records import AttemptNode, AttemptRecord, Manifest, RecoveryRecord

ROOT = Path(__file__).resolve().parents[1]
OWNERS = frozenset({"glue/runs/records.py", "glue/runs/store.py"})
DEFAULT = (ROOT / "glue",)
RAW_READERS = {"manifest": 0, "attempt": 1, "recoveries": 0, "find_manifest": 0}  # method -> its arguments
# The names glue gives a record it holds ("record" and "last" name other JSON too: an exit record, a note).
RECORD_NAMES = frozenset({"manifest", "attempt", "att", "prev", "started", "rec", "recovery", "failed_attempt",
                          "new_attempt"})
# The names glue gives an attempt's node (an AttemptNode; "n" elsewhere is a number, never read by key). A
# recovery record's `nodes` are still dicts (old/new id, replaced, ...): none of their keys read here is a field.
NODE_NAMES = frozenset({"nd", "node", "head", "n", "lost_node"})
NODE_ENTRY = "nodes[k]"  # `record.nodes[k]`, `nodes_of(attempt)[0]`: an entry of a record's nodes
KEY_READS = frozenset({"get", "setdefault", "pop"})
FIELDS = frozenset(f.name for cls in (Manifest, AttemptRecord, RecoveryRecord, AttemptNode)
                   for f in fields(cls)) - {"extra"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _name(node: ast.expr) -> str | None:
    """The identifier an expression ends in: `attempt`, `report.attempt`, `self.manifest` -> the last name;
    an entry of a record's nodes (`record.nodes[k]`, `records.nodes_of(attempt)[0]`) -> NODE_ENTRY."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and _name(node.value) in ("nodes", "nodes_of"):
        return NODE_ENTRY
    if isinstance(node, ast.Call):
        return _name(node.func) if _name(node.func) == "nodes_of" else None
    return None


def _key(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _of_record(base: ast.expr, key: str | None) -> str | None:
    """Why reading `key` out of `base` reads a record by key (None: it does not)."""
    if key is None:
        return None
    if isinstance(base, ast.Attribute) and base.attr == "extra":
        return f"key {key!r} read out of a record's extra: make it a field of its type (glue/runs/records.py)"
    if isinstance(base, ast.Call) and _name(base.func) == "to_dict":
        return f"key {key!r} read out of a record's to_dict(): read the attribute"
    if _name(base) in RECORD_NAMES | NODE_NAMES | {NODE_ENTRY} and key in FIELDS:
        return f"record key {key!r} read by string from {_name(base)!r}: read the attribute of its type"
    return None


def _problems(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Subscript):
        why = _of_record(node.value, _key(node.slice))
        if why:
            yield why
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return
    method = node.func.attr
    if method in KEY_READS and node.args:
        why = _of_record(node.func.value, _key(node.args[0]))
        if why:
            yield why
    if RAW_READERS.get(method) == len(node.args) and not node.keywords:
        yield (f"`.{method}(...)` reads the record's JSON as stored: use RunStore's typed reader "
               "(read_manifest, read_attempt, latest_attempt, read_recoveries)")


def check_source(source: str, path: str) -> list[Finding]:
    tree = ast.parse(source, filename=path)
    return [Finding(path, node.lineno, what) for node in ast.walk(tree) for what in _problems(node)]


def check(paths: list[Path]) -> list[Finding]:
    findings: list[Finding] = []
    for top in paths:
        for file in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            rel = file.resolve().relative_to(ROOT).as_posix() if file.resolve().is_relative_to(ROOT) else str(file)
            if rel not in OWNERS:
                findings += check_source(file.read_text(), rel)
    return sorted(findings, key=lambda f: (f.path, f.line))


def main(argv: list[str]) -> int:
    findings = check([Path(a) for a in argv] or list(DEFAULT))
    for f in findings:
        print(f)
    if findings:
        print("lint: the run's records are read through their types (glue/runs/records.py), never by key")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

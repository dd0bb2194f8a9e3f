"""`python -m glue.train.workspace prepare SPEC | target`: the result as one JSON line on stdout; a
problem as one line on stderr and exit 2 (the controller shows that line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glue.train.storage.target import open_bucket
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.prepare import prepare
from glue.train.workspace.target import target


def main(argv: list[str]) -> int:
    if argv == ["target"]:
        try:
            print(json.dumps(target()))
        except WorkspaceError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        return 0
    if len(argv) != 2 or argv[0] != "prepare":
        print("usage: python -m glue.train.workspace prepare SPEC.json | target", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    try:
        result = prepare(open_bucket(spec), spec)
    except WorkspaceError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

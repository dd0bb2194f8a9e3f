"""`python -m tests.lint_vm_python`: the code that runs on a VM works on every Python the VM may have.

The VM side is what the trainer role installs and what glue starts there: `glue.train` (the supervisor,
`workspace prepare`, the checkpoint check), the example trainer, memprobe's trial on a VM and the `glue`
launcher (which must say in one line, on any Python, that the controller needs 3.11), with every glue
module they import. The VM's Python is the image's: Ubuntu 22.04 has 3.10, Debian 12 3.11, Ubuntu 24.04
3.12. The controller runs on >= 3.11 (glue.launch says so on an older one).

Checked statically, by the real tools: mypy with typeshed's view of Python 3.10 and of 3.12 (a 3.11-only
API such as datetime.UTC, typing.Self, enum.StrEnum, exception groups; an API gone by 3.12), ruff's
per-file target py310 (3.11 syntax such as except*) covering every file of the VM side, and each
standard-library module they import present from 3.10 to 3.13 (typeshed's VERSIONS: tomllib is 3.11+,
distutils and imp are gone in 3.12; mypy's ignore_missing_imports would hide those).
"""

from __future__ import annotations

import ast
import fnmatch
import sys
import tomllib
from pathlib import Path

import mypy.api

ROOT = Path(__file__).resolve().parent.parent
# What the VM starts (python -m ...) or imports from the wheel; the rest follows their imports.
ENTRY_POINTS = ("glue.train", "glue.examples", "glue.memprobe.vm_trial", "glue.memprobe.worker", "glue.launch")
# Its imports are not followed: it imports glue.cli only on Python >= 3.11, as the controller.
LAUNCHER = "glue.launch"
VM_PYTHONS = ((3, 10), (3, 12))
NEWEST_CHECKED = (3, 13)


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def vm_side() -> dict[str, Path]:
    """Every glue module the entry points reach (packages: all their modules), by import statements."""
    todo = [m for m in ENTRY_POINTS]
    for package in ("glue.train", "glue.examples"):
        todo += [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in ROOT.joinpath(*package.split(".")).rglob("*.py")]
    found: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if module in found or path is None:
            continue
        found[module] = path
        parts = module.split(".")
        if module == LAUNCHER:
            continue
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "glue"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "glue":
                todo += [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def stdlib_versions() -> dict[str, tuple[tuple[int, int], tuple[int, int] | None]]:
    """typeshed's stdlib/VERSIONS, as mypy ships it: module -> (first, last or None) Python version."""
    text = (Path(mypy.api.__file__).parent / "typeshed" / "stdlib" / "VERSIONS").read_text()
    out: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, span = (s.strip() for s in line.split(":", 1))
        first, _, last = (s.strip() for s in span.partition("-"))

        def version(s: str) -> tuple[int, int]:
            major, minor = s.split(".")
            return int(major), int(minor)
        out[name] = (version(first), version(last) if last else None)
    return out


def stdlib_problems(files: dict[str, Path]) -> list[str]:
    versions = stdlib_versions()
    low, high = VM_PYTHONS[0], NEWEST_CHECKED
    problems = []
    for path in files.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                parts = name.split(".")
                known = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                              if ".".join(parts[:i]) in versions), None)
                if known is None:
                    continue
                first, last = versions[known]
                if first > low or (last is not None and last < high):
                    span = f"{first[0]}.{first[1]}-" + (f"{last[0]}.{last[1]}" if last else "")
                    problems.append(f"{_shown(path)}:{node.lineno}: imports {name}, which Python has "
                                    f"only in {span} (the VM side runs on {low[0]}.{low[1]} to {high[0]}.{high[1]})")
    return problems


def ruff_coverage_problems(files: dict[str, Path]) -> list[str]:
    """Every VM-side file under one of pyproject.toml's per-file-target-version patterns for py310."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    patterns = [p for p, v in config.get("per-file-target-version", {}).items() if v == "py310"]
    return [f"{_shown(path)} runs on the VM but no [tool.ruff] per-file-target-version pattern sets it "
            "to py310: add it there" for path in files.values() if not any(fnmatch.fnmatch(_shown(path), p)
                                                                          for p in patterns)]


def mypy_problems(files: dict[str, Path]) -> list[str]:
    problems = []
    for major, minor in VM_PYTHONS:
        out, err, code = mypy.api.run(["--python-version", f"{major}.{minor}", "--no-error-summary",
                                       *(_shown(p) for p in sorted(files.values()))])
        if code != 0:
            problems += [f"{line} (as Python {major}.{minor})" for line in (out + err).splitlines() if line.strip()]
    return problems


def main() -> int:
    files = vm_side()
    problems = ruff_coverage_problems(files) + stdlib_problems(files) + mypy_problems(files)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"lint_vm_python: {len(problems)} problem(s) in the code that runs on a VM (Python "
              f"{VM_PYTHONS[0][0]}.{VM_PYTHONS[0][1]}+); fix them or keep the API off the VM side", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

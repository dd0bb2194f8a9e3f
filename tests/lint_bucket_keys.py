"""`make lint`: no bucket key is spelled outside glue/train/layout.py, the one module that names them.

    python -m tests.lint_bucket_keys [PATH ...]     (default: glue, bench and tests)

Every string literal in the Python files under PATH (docstrings aside; an f-string's text with its
placeholders) is checked against the names layout defines (layout.KEY_SEGMENTS, layout.KEY_FILES):

- a key segment spelled as one, `<segment>/` at a path boundary (`"incidents/"`, `f"runs/{run}/"`,
  `"s3://b/ckpt/step-1"`, `" under ckpt-invalid/"`);
- a key file name as the whole literal or one whole part of an f-string (`"manifest.json"`,
  `f"{prefix}manifest.json"`), or after a `/` (`"ckpt/step-1/COMMIT.json"`, `"/COMMIT.json"`).

Prose that names a file ("COMMIT.json is missing") is not a key, nor are three narrow forms: run.yaml's location
template `runs/{run}` in a plain string (the user's format, which glue.runs.config substitutes: a test's run
config, not a key it builds), a folder of the glue package (`glue/runs/records.py`) and a literal that starts as
a path on the machine itself (`/run/gpukit/runs/<run>`, `/var/lib/gpukit/envs/<set>`, `/tmp/...`: tmpfs and disk,
where the bucket is `s3://...` or its mount, `/mnt/s3`). Files whose literal keys are the point (DELIBERATE) are
not checked; single literals are let through exactly (NOT_BUILT: for good; ALLOWED: until their files change).
Each finding is printed as `file:line: ...`; the exit status is 1 when there is one, or when an entry of those
lists no longer matches.
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
# What `make lint` checks: the product, the benches (a key spelled by hand there measures a layout that may no
# longer be the product's) and the tests (one that spells a key checks a layout that may no longer be the product's).
DEFAULT = (ROOT / "glue", ROOT / "bench", ROOT / "tests")
# Files whose literal keys are the point: they pin the stored format, so a change to layout.py must fail them.
DELIBERATE: dict[str, str] = {
    "tests/unit/test_layout.py": "pins every key layout.py builds to its literal spelling",
    "tests/integration/test_run_store.py": "reads and writes a run by the literal keys buckets already hold",
    "tests/unit/test_lint_bucket_keys.py": "this lint's own test: keys spelled by hand are its input",
    "tests/lint_bucket_keys.py": "this lint: its lists below name the literals they let through, exactly",
}
MARK = "\x00"  # an f-string placeholder in the text checked
_NAME = r"A-Za-z0-9_.\-"

# Literals that stay as they are, each for its reason, exactly as (file, the literal as this checker shows it,
# placeholders as {}); an entry that matches nothing fails the check.
NOT_BUILT: dict[tuple[str, str], str] = {
    ("tests/integration/test_lease.py", "lease/{}/claim-{}.json"): "a claim read by the key buckets already hold",
    ("tests/unit/test_workdir_pack.py", "ckpt/a.bin"): "a file in the user's workdir, packed: not a bucket key",
    ("tests/unit/test_workdir_pack.py", "ckpt/b.bin"): "a file in the user's workdir, packed: not a bucket key",
    ("tests/unit/test_workdir_pack.py", "over the 4 MiB cap (workdir.max_size_mb); largest: ckpt/a.bin (3.0 MiB), "
     "ckpt/b.bin (2.0 MiB)"): "glue's message naming those workdir files",
    ("tests/lyceum_emulator/executions.py", "/logs/execution/([^/]+)"): "a route of the Lyceum API, not a bucket key",
}

# Keys still spelled by hand in files other engineers are changing (issue 50): allowed, temporarily and
# exactly, as NOT_BUILT's entries are. Remove an entry once its file builds the key through glue.train.layout
# or RunStore; an entry that matches nothing fails the check.
_RUNS = "tests/integration/test_runs.py"
ALLOWED: frozenset[tuple[str, str]] = frozenset({
    (_RUNS, "runs/{}/"), (_RUNS, "runs/{}/attempts/1.json"), (_RUNS, "runs/hb-kill/manifest.json"),
    (_RUNS, "runs/live/attempts/1.json"), (_RUNS, "runs/once-stop/attempts/1.json"), (_RUNS, "attempts/2.json"),
    (_RUNS, "recoveries/1.json"), (_RUNS, "COMMIT.json"), (_RUNS, "/COMMIT.json"), (_RUNS, "/mnt/s3/runs/{}/outputs"),
    ("tests/e2e/test_memprobe_own_job.py", "memprobe/"), ("tests/e2e/test_memprobe_own_job.py", "manifest.json"),
    ("tests/e2e/test_report_drill.py", "report.html"),
    ("tests/unit/test_workspace_pack.py", "delete envs/{}/ from the bucket"),
    ("tests/unit/test_workspace_pack.py", "index envs/.* is not JSON; not using it"),
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
        out.append((f"key segment {seg}/", re.compile(rf"(?:^|(?<=[^{_NAME}]))(?<!glue/){s}/")))
    return out


def _file_res() -> list[tuple[str, str, re.Pattern[str]]]:
    return [(f"key {name}", name, re.compile(rf"/{re.escape(name)}(?=$|[^{_NAME}])")) for name in layout.KEY_FILES]


SEGMENTS, FILES = _segment_res(), _file_res()


# run.yaml's location template (`s3://{bucket}/runs/{run}/outputs`): glue.runs.config substitutes {run}.
TEMPLATE = re.compile(rf"(?:^|(?<=[^{_NAME}])){re.escape(layout.run_prefix('{run}').rstrip('/'))}(?=$|/)")
# A path on the machine itself (the VM's tmpfs and disk, a temp folder): not in the bucket.
LOCAL = re.compile(r"^/(?:run|var|tmp)/")


def key_problems(text: str) -> list[str]:
    """What in one literal's text (placeholders as MARK) spells a bucket key."""
    if LOCAL.match(text):
        return []
    text = TEMPLATE.sub("{run}", text)
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


def check(paths: list[Path], allowed: frozenset[tuple[str, str]] = ALLOWED | frozenset(NOT_BUILT),
          ) -> tuple[list[Finding], list[str]]:
    """(findings not allowed, allow-list entries that matched nothing) for the .py files under paths."""
    findings: list[Finding] = []
    for top in paths:
        for file in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            rel = file.resolve().relative_to(ROOT).as_posix() if file.resolve().is_relative_to(ROOT) else str(file)
            if rel == OWNER or rel in DELIBERATE:
                continue
            findings += check_source(file.read_text(), rel)
    used = {(f.path, f.text) for f in findings} & allowed
    stale = sorted(f"{p}: {t!r}" for p, t in allowed - used if any(_covers(top, p) for top in paths))
    stale += [f"{p!r} of DELIBERATE (no such file)" for p in DELIBERATE
              if not (ROOT / p).is_file() and any(_covers(top, p) for top in paths)]
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

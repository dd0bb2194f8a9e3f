"""The docs cannot drift: the README stays short, every Python and shell example in the README and the
docs either runs here or says why not, the generated reference is current, and every pointer glue gives
the user into the docs names a page that exists.

Examples are marked by an HTML comment on the line before the fence:
  <!-- run -->                    this test runs it (python: in a fresh process, as a trainer deployed
                                  with its bucket in a folder; sh: bash in the repository, glue on PATH)
  <!-- run: tests/unit/x.py -->   that test extracts and runs it (it must name this page)
  <!-- not run: REASON -->        shown only, for the reason given (a cloud account, a cluster, ...)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from glue.train import validate_checkpoints
from glue.train.layout import METRICS_PREFIX, run_prefix, run_uri

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
EXAMPLE_LANGS = {"python", "py", "sh", "bash", "shell", "console"}
# Pages other engineers are writing now: their examples get marked when they land in the site's nav.
PENDING: set[str] = set()
MARK = re.compile(r"^<!--\s*(run(?::\s*(?P<test>\S+))?|not run:\s*(?P<why>.*\S))\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: str  # the marker comment before the fence, "" without one

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[str]:
    pages = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p not in PENDING]


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page (indented fences too: examples inside list items)."""
    lines = (ROOT / page).read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end])
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        found.append(Block(page, i + 1, lang.lower(), code, before if MARK.match(before) else ""))
        i = end + 1
    return found


def examples() -> list[Block]:
    return [b for page in doc_pages() for b in blocks(page) if b.lang in EXAMPLE_LANGS]


def test_readme_is_at_most_300_lines() -> None:
    count = len((ROOT / "README.md").read_text().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines: move detail into a docs page"


def test_every_example_runs_or_says_why_not() -> None:
    unmarked = [b.where for b in examples() if not b.mark]
    assert not unmarked, ("examples neither run nor marked `<!-- not run: reason -->` on the line before "
                          f"the fence: {', '.join(unmarked)}")
    assert any(MARK.match(b.mark) and b.mark.startswith("<!-- run") for b in examples())


def test_an_example_run_elsewhere_is_run_by_a_test_that_reads_its_page() -> None:
    for b in examples():
        test = (MARK.match(b.mark) or re.match("", "")).groupdict().get("test")
        if test:
            source = ROOT / test
            assert source.is_file(), f"{b.where}: {test} does not exist"
            assert b.page in source.read_text(), f"{b.where}: {test} does not read {b.page}"


def _run_env(tmp_path: Path) -> dict[str, str]:
    """A deployed trainer's environment with the bucket in a folder (the serverless mode: the bucket only
    at its mount), so RunContext, its checkpointer and its records all live under tmp_path/bucket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUKIT_", "AWS_"))}
    venv_bin = str(ROOT / ".venv" / "bin")
    env.update({
        "GPUKIT_RUN": "docs-example", "GPUKIT_ATTEMPT": "1", "GPUKIT_BUCKET_NAME": "gpukit",
        "GPUKIT_BUCKET_VIA": "mount", "GPUKIT_BUCKET_MOUNT": str(tmp_path / "bucket"),
        "GPUKIT_CHECKPOINT": run_uri("gpukit", "docs-example"),
        "GPUKIT_OUTPUTS": f"{run_uri('gpukit', 'docs-example')}/out",
        "GPUKIT_CONFIG": '{"steps": 12}', "GPUKIT_CHECKPOINT_INTERVAL": "5", "GPUKIT_SCRATCH": str(tmp_path),
        "GPUKIT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), "PATH": f"{venv_bin}:{env.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
    })
    return env


def _distinct_runnable() -> dict[str, list[Block]]:
    """The `<!-- run -->` examples by code: one shown on several pages (the trainer contract's loop, in the
    README and its guide) runs once."""
    out: dict[str, list[Block]] = {}
    for b in examples():
        if b.mark == "<!-- run -->":
            out.setdefault(b.code, []).append(b)
    return out


RUNNABLE = list(_distinct_runnable().values())


def _run(block: Block, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-c", block.code] if block.lang in ("python", "py") else \
        ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{block.where} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


@pytest.mark.parametrize("shown", RUNNABLE, ids=[" ".join(b.where for b in bs) for bs in RUNNABLE])
def test_runnable_example_runs(shown: list[Block], tmp_path: Path) -> None:
    block = shown[0]
    (tmp_path / "bucket").mkdir()
    env = _run_env(tmp_path)
    _run(block, env)
    if block.lang in ("python", "py") and "ctx.step(" in block.code:
        # A trainer: its first attempt trains 12 steps; a second attempt, resumed, continues to 20.
        run = tmp_path / "bucket" / run_prefix("docs-example")
        _run(block, {**env, "GPUKIT_ATTEMPT": "2", "GPUKIT_RESUME": "1", "GPUKIT_CONFIG": '{"steps": 20}'})
        _assert_trainer_kept_the_contract(block, run)


def _steps(run: Path, attempt: int) -> list[int]:
    parts = sorted((run / METRICS_PREFIX).glob(f"{attempt:03d}-*.jsonl"))
    return sorted(json.loads(line)["step"] for part in parts for line in part.read_text().splitlines() if line)


def _assert_trainer_kept_the_contract(block: Block, run: Path) -> None:
    """Every step reached the run's records, checkpoints were committed valid, and the resumed attempt
    continued right after the first attempt's last checkpoint."""
    valid = sorted(s.step for s in validate_checkpoints(str(run)) if s.valid)
    assert valid and valid[-1] == 20, f"{block.where}: valid checkpoints {valid}"
    assert _steps(run, 1) == list(range(1, 13)), f"{block.where}: attempt 1 recorded steps {_steps(run, 1)}"
    assert _steps(run, 2) == list(range(13, 21)), f"{block.where}: the resumed attempt recorded {_steps(run, 2)}"


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"


def _reference() -> Any:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_covers_the_code() -> None:
    """The reference pages the site build generates name every failure class, every Terraform variable and
    output, every run.yaml key, and render the click app (mkdocs-click)."""
    from glue.runs.class_policy import AttemptClass

    ref = _reference()
    classes = ref.failure_classes_page()
    assert all(f"| `{c.value}` |" in classes for c in AttemptClass)
    terraform = ref.terraform_page()
    module = ROOT / "terraform" / "modules" / "cluster"
    for kind, tf in (("variable", "variables.tf"), ("output", "outputs.tf")):
        names = re.findall(rf'^{kind} "([^"]+)"', (module / tf).read_text(), re.M)
        assert names and all(f"| `{n}` |" in terraform for n in names), kind
    schema = json.loads((ROOT / "docs" / "run-config.schema.json").read_text())
    config = ref.run_config_page()
    for spec in [schema, *schema["$defs"].values()]:
        assert all(f"| `{key}` |" in config for key in spec.get("properties", {}))
    assert ":module: glue.cli" in ref.cli_page()


def test_the_designs_backend_excerpt_names_every_member_of_the_protocol() -> None:
    """docs/design.md shows the Backend protocol as an excerpt: a member added to glue/cloud/base.py and
    left out of it fails here."""
    from glue.cloud.base import AnnouncesTermination, Backend

    design = (ROOT / "docs" / "design.md").read_text()
    excerpt = design.split("class Backend(Protocol):", 1)[1].split("```", 1)[0]
    for proto in (Backend, AnnouncesTermination):
        methods = [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")]
        members = [*proto.__annotations__, *methods]
        missing = [m for m in members if not re.search(rf"\b{m}\b", excerpt)]
        assert not missing, f"docs/design.md's Backend excerpt lacks {missing}"


def test_a_broken_link_fails_the_strict_site_build(tmp_path: Path) -> None:
    """make lint's site build is strict for real: a link to a missing page fails it (mkdocs counts strict's
    warnings only when it logs them, so the Makefile must not pass -q)."""
    lint = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    build = next(line for line in lint.splitlines() if "mkdocs build" in line)
    assert "--strict" in build and " -q" not in build, build
    for part in ("mkdocs.yml", "docs", "scripts"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    for part in ("glue", "terraform"):  # what the generated reference pages are made from
        (tmp_path / part).symlink_to(ROOT / part)
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\nSee [a page that is not there](no-such-page.md).\n")
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr, proc.stderr[-2000:]


def test_every_make_target_is_in_the_readme_and_the_commands_page() -> None:
    targets = re.findall(r"^([a-z-]+):.*## ", (ROOT / "Makefile").read_text(), re.M)
    assert "docs" in targets
    for page in ("README.md", "docs/commands.md"):
        text = (ROOT / page).read_text()
        missing = [t for t in targets if f"`make {t}" not in text]
        assert not missing, f"{page} does not list make {missing}"

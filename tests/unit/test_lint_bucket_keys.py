"""`make lint`'s bucket-key check (tests/lint_bucket_keys.py): it fails on a key spelled by hand outside
glue/train/layout.py, naming file:line, in glue/, bench/ and tests/, and passes on the tree as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import lint_bucket_keys as lint

SAMPLE = '''"""A module docstring may say runs/<run>/manifest.json and incidents/<ts>.json: it is prose."""
from glue.train import layout


def f(store, run, step, gen):
    """So may a function's: ckpt/step-<N>/COMMIT.json."""
    store.put_json("manifest.json", {})
    store.keys("incidents/")
    key = f"recoveries/{step}.json"
    uri = f"s3://gpukit/runs/{run}/outputs"
    commit = f"ckpt/step-{step}/COMMIT.json"
    path = f"{store.prefix}manifest.json"
    done = key.endswith("/COMMIT.json")
    lease = "lease/%06d/released.json" % gen
    note = "the skipped step is kept under ckpt-invalid/"
    fine = [layout.MANIFEST, layout.incident_key("t", "x"), "COMMIT.json is missing (interrupted save)",
            "glue memprobe --run r", "state.json", f"{run}-report.html", "/run/gpukit/runs", "ckpt_corrupt",
            "outputs.destination", "workdir/code", "gpukit-logs/x"]
    return fine
'''


def _findings(tmp_path: Path, source: str, name: str = "sample.py") -> list[lint.Finding]:
    path = tmp_path / name
    path.write_text(source)
    findings, _ = lint.check([path], allowed=frozenset())
    return findings


def test_hand_spelled_keys_fail_naming_file_and_line(tmp_path: Path) -> None:
    found = _findings(tmp_path, SAMPLE)
    lines = SAMPLE.splitlines()
    by_line = {f.line: f for f in found}
    flagged = {lines[n - 1].strip().split(" = ")[0].split("(")[0] for n in by_line}
    assert flagged == {"store.put_json", "store.keys", "key", "uri", "commit", "path", "done", "lease", "note"}
    assert all(str(f).startswith(f"{tmp_path / 'sample.py'}:{f.line}: ") for f in found)
    assert "build it with glue.train.layout" in str(found[0])
    assert not any(lines[f.line - 1].lstrip().startswith(('"""', "fine", '"glue')) for f in found)


@pytest.mark.parametrize(("literal", "flagged"), [
    ('"attempts/"', True), ('f"attempts/{n}.exit.json"', True), ('"watch/state.json"', True),
    ('f"metrics/{a:03d}-r{r}-{p:05d}.jsonl"', True), ('f"logs/{a:03d}-"', True), ('"code/" + sha', True),
    ('f"wheels/{s}/index.json"', True), ('"evaluation/"', True), ('f"memprobe/{t}.json"', True),
    ('"heartbeat.json"', True), ('"drill.json"', True), ('"report.html"', True), ('"REJECTED.json"', True),
    ('"x/released.json"', True),
    ('"manifest"', False), ('"the code/data split"', True), ('"pre-incidents/x"', False), ('"heartbeat"', False),
    ('"drill.json.bak"', False), ('"a run\'s report.html page"', False),
    # run.yaml's location template (glue.runs.config substitutes {run}) is the user's format, not a key...
    ('"s3://{bucket}/runs/{run}/outputs"', False), ('"/mnt/s3/runs/{run}/"', False),
    # ...but an f-string's {run} is a value, and a key below the template is still one.
    ('f"s3://{b}/runs/{run}"', True), ('"runs/{run}/attempts/1.json"', True), ('"runs/{runs}"', True),
    # A folder of the glue package and a path on the machine itself are not in the bucket; the mount is.
    ('"glue/runs/records.py"', False), ('"/run/gpukit/runs/r1"', False), ('f"/var/lib/gpukit/envs/{s}"', False),
    ('"/tmp/gpukit/runs/r1/attempt-3.json"', False), ('"/mnt/s3/runs/r1"', True), ('"x/run/runs/r1"', True),
])
def test_each_kind_of_key(tmp_path: Path, literal: str, flagged: bool) -> None:
    assert bool(_findings(tmp_path, f"x = {literal}\n")) is flagged


def test_the_allow_list_is_exact_and_an_entry_that_matches_nothing_fails(tmp_path: Path) -> None:
    path = tmp_path / "old.py"
    path.write_text('KEY = "watch/state.json"\n')
    entry = (str(path), "watch/state.json")
    assert lint.check([path], allowed=frozenset({entry})) == ([], [])
    findings, stale = lint.check([path], allowed=frozenset({(str(path), "watch/other.json")}))
    assert [f.line for f in findings] == [1] and stale == [f"{path}: 'watch/other.json'"]


def test_layout_itself_is_the_one_place_keys_are_spelled() -> None:
    assert (lint.ROOT / lint.OWNER).is_file()
    assert lint.check_source((lint.ROOT / lint.OWNER).read_text(), lint.OWNER)  # would be found anywhere else


def test_by_default_it_checks_the_product_the_benches_and_the_tests() -> None:
    assert [p.relative_to(lint.ROOT).as_posix() for p in lint.DEFAULT] == ["glue", "bench", "tests"]
    assert all(p.is_dir() for p in lint.DEFAULT)


def test_a_test_is_checked_as_the_product_is_but_a_deliberate_file_is_not() -> None:
    """A test that spells a key is named `tests/<file>:<line>`; the files whose literal keys are the point
    (pinning the stored format) are exempt, each for a one-line reason, and each exists."""
    found = lint.check_source('store.get_json("watch/state.json")\n', "tests/unit/test_x.py")
    assert [str(f) for f in found] == ["tests/unit/test_x.py:1: key segment watch/ in 'watch/state.json': build it "
                                       "with glue.train.layout"]
    assert "tests/unit/test_layout.py" in lint.DELIBERATE
    for rel, why in lint.DELIBERATE.items():
        assert (lint.ROOT / rel).is_file() and why and "\n" not in why and len(why) < 100, rel
    pinned = lint.ROOT / "tests/unit/test_layout.py"
    assert lint.check_source(pinned.read_text(), "tests/unit/test_layout.py")  # it does spell keys...
    assert lint.check([pinned], allowed=frozenset()) == ([], [])  # ...on purpose
    assert all(why and "\n" not in why for why in lint.NOT_BUILT.values())


def test_a_bench_is_checked_as_the_product_is() -> None:
    """A key in a bench is named `bench/<file>:<line>`, as make lint prints it; the benches build theirs."""
    assert lint.check([lint.ROOT / "bench"], allowed=frozenset()) == ([], [])
    found = lint.check_source('rec = store.get_json("recoveries/1.json")\n', "bench/watch.py")
    assert [str(f) for f in found] == ["bench/watch.py:1: key segment recoveries/ in 'recoveries/1.json': build it "
                                       "with glue.train.layout"]


def test_main_passes_on_the_tree() -> None:
    res = subprocess.run([sys.executable, "-m", "tests.lint_bucket_keys"], cwd=lint.ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_main_fails_on_a_file_with_a_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('\n\nPREFIX = "incidents/"\n')
    res = subprocess.run([sys.executable, "-m", "tests.lint_bucket_keys", str(bad)], cwd=lint.ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and f"{bad}:3: key segment incidents/" in res.stdout, res.stdout

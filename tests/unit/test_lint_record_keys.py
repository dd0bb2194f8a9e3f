"""`make lint`'s record-key check (tests/lint_record_keys.py): a record read by key in glue/ fails it; the
same reads through the record types, and other JSON read by key, pass; glue/ as it stands passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import lint_record_keys as lint

BAD = [
    ('rc = parse(manifest["config"])', "record key 'config' read by string from 'manifest'"),
    ('vm = attempt.get("vm_id")', "record key 'vm_id' read by string from 'attempt'"),
    ('key = report.attempt.get("incident")', "record key 'incident' read by string from 'attempt'"),
    ('n = int(self.manifest.setdefault("distributed", {}))', "record key 'distributed' read by string"),
    ("doc = store.manifest()", "`.manifest(...)` reads the record's JSON as stored"),
    ("rec = store.attempt(n)", "`.attempt(...)` reads the record's JSON as stored"),
    ("done = store.recoveries()", "`.recoveries(...)` reads the record's JSON as stored"),
    ('why = rec.extra["reason"]', "key 'reason' read out of a record's extra"),
    ('vm = rec.to_dict().get("vm")', "key 'vm' read out of a record's to_dict()"),
    # An attempt's node entries (AttemptNode): by the names glue gives them, or as an entry of `nodes`.
    ('on = {str(nd.get("vm_id")) for nd in nodes}', "record key 'vm_id' read by string from 'nd'"),
    ('pid = node["trainer_pid"]', "record key 'trainer_pid' read by string from 'node'"),
    ('at = head["started_at"]', "record key 'started_at' read by string from 'head'"),
    ('why = node.get("cold_reason")', "record key 'cold_reason' read by string from 'node'"),
    ('vms = [n.get("vm") for n in report.attempt.nodes]', "record key 'vm' read by string from 'n'"),
    ('gpus = record.nodes[k]["docker_gpus"]', "record key 'docker_gpus' read by string from 'nodes[k]'"),
    ('vm = records.nodes_of(rec)[0].get("vm")', "record key 'vm' read by string from 'nodes[k]'"),
]
GOOD = [
    "rc = parse(manifest.config)",
    "vm = attempt.vm_id if attempt else None",
    'step = beat.get("step")',
    'final = rec.get("final")',  # an evaluation record: not a record field
    'code = exit_rec.get("exit_code")',
    "n = store.attempts()[-1]",
    "rec = store.read_attempt(n)",
    'rec.update(failure_class="killed", reason="stopped")',
    "on = {str(nd.vm_id) for nd in records.nodes_of(latest)}",
    'new_vms = sum(1 for n in rec.nodes if n.get("replaced"))',  # a recovery record's node: no node field
    "record.nodes[k].add_pids(pids)",
    'record["nodes"][0].update(pids)',  # the Slurm node writing the JSON: no read
    "n = nodes[0] + n",
]


@pytest.mark.parametrize(("source", "says"), BAD)
def test_a_record_read_by_key_is_found(source: str, says: str) -> None:
    [finding] = lint.check_source(source, "glue/x.py")
    assert says in finding.what and str(finding).startswith("glue/x.py:1: ")


@pytest.mark.parametrize("source", GOOD)
def test_reads_through_the_types_and_other_json_pass(source: str) -> None:
    assert lint.check_source(source, "glue/x.py") == []


def test_glue_reads_its_records_through_their_types(capsys: pytest.CaptureFixture[str]) -> None:
    assert lint.main([]) == 0, capsys.readouterr().out
    assert lint.check([lint.ROOT / "glue" / "runs" / "records.py"]) == []  # the types' own module may


def test_the_lint_fails_on_a_file_that_reads_a_record_by_key(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('def f(store):\n    return store.read_manifest().to_dict()["config"]\n')
    assert lint.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "bad.py:2: key 'config' read out of a record's to_dict()" in out and "never by key" in out

"""RunStore has a method for every record of a run, and they read and write the keys buckets already
hold (docs/design.md §4, spelled out here as the literal keys): a run recorded before glue.train.layout
owned the keys reads back the same."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from glue.runs import lease
from glue.runs.store import RunStore, run_ids
from glue.storage import bucket
from tests.conftest import BucketHandle

pytestmark = pytest.mark.integration

AT = "2025-01-02T03:04:05.123456Z"


def _store(local_bucket: BucketHandle) -> RunStore:
    return RunStore(local_bucket.info, local_bucket.creds, f"store-{uuid.uuid4().hex[:8]}")


def test_every_record_written_through_run_store_lands_under_its_known_key(local_bucket: BucketHandle) -> None:
    store = _store(local_bucket)
    store.put_manifest({"run": store.run, "config": {}})
    store.put_attempt({"run": store.run, "attempt": 1})
    incident = store.put_incident({"class": "vm_lost", "detected_at": AT}, "vm_lost", AT)
    assert store.add_recovery({"failed_attempt": 1}) == 1
    assert store.add_recovery({"failed_attempt": 2}) == 2
    store.put_recovery(2, {"failed_attempt": 2, "verified": True})
    store.put_watch_state({"run": store.run, "done": False})
    store.put_drill({"passed": True})
    where = store.put_report(b"<html></html>")
    snap = store.put_memprobe_snapshot("20250102T030405Z", b"\x80")
    probe = store.put_memprobe("20250102T030405Z", {"fits": True, "cuda_snapshot_file": snap})
    held = lease.acquire(store, "deploy")
    lease.release(store, held)
    assert set(store.keys()) == {
        "manifest.json", "attempts/1.json", "incidents/20250102T030405.123456Z-vm_lost.json", "recoveries/1.json",
        "recoveries/2.json", "watch/state.json", "drill.json", "report.html", "memprobe/20250102T030405Z.json",
        "memprobe/20250102T030405Z.snapshot.pickle", f"lease/{held.gen:06d}/claim-{held.token}.json",
        f"lease/{held.gen:06d}/released.json",
    }
    s3 = bucket.client(local_bucket.info, local_bucket.creds)
    assert bucket.read(s3, "gpukit", f"runs/{store.run}/manifest.json") is not None
    assert store.run in run_ids(store.info, store.creds)
    assert incident == "incidents/20250102T030405.123456Z-vm_lost.json"
    assert store.incident(incident) == {"class": "vm_lost", "detected_at": AT}
    assert where == f"s3://gpukit/runs/{store.run}/report.html"
    assert probe == f"runs/{store.run}/memprobe/20250102T030405Z.json"
    assert snap == f"runs/{store.run}/memprobe/20250102T030405Z.snapshot.pickle"
    assert [r["failed_attempt"] for r in store.recoveries()] == [1, 2] and store.recoveries()[1]["verified"]
    assert store.watch_state() == {"run": store.run, "done": False} and store.drill() == {"passed": True}


def _legacy(store: RunStore) -> dict[str, Any]:
    """A run's records as the code before glue.train.layout wrote them: literal keys."""
    records: dict[str, Any] = {
        "manifest.json": {"run": store.run, "config": {}, "checkpoint": {"target": "s3://gpukit/runs/x"}},
        "attempts/1.json": {"attempt": 1}, "attempts/2.json": {"attempt": 2},
        "attempts/2.exit.json": {"node": 0, "exit_code": 0}, "attempts/2.exit.node1.json": {"node": 1},
        "attempts/2.error.rank1.json": {"rank": 1}, "attempts/2.error.rank1.x01.json": {"rank": 1, "restart": 1},
        "attempts/2.notice.rank0.json": {"rank": 0, "step": 9},
        "heartbeat.json": {"attempt": 2, "rank": 0, "recent": [{"attempt": 2, "step": 11, "rank": 0}]},
        "heartbeat.rank1.json": {"attempt": 2, "rank": 1, "recent": []},
        "incidents/20250102T030405.000001Z-vm_lost.json": {"class": "vm_lost"},
        "incidents/20250102T030406.000001Z-ckpt_corrupt.json": {"class": "ckpt_corrupt"},
        "recoveries/10.json": {"k": 10}, "recoveries/9.json": {"k": 9},
        "watch/state.json": {"run": store.run}, "drill.json": {"passed": False},
        "evaluation/002-000000010.json": {"step": 10, "final": False},
        "evaluation/002-000000020.json": {"step": 20, "final": True},
        "ckpt/step-20/COMMIT.json": {"step": 20, "timings": {"upload_s": 1.0}},
    }
    for key, doc in records.items():
        store.put_json(key, doc)
    store.put_bytes("ckpt/step-20/model.pt", b"weights")
    store.put_bytes("metrics/002-r0-00001.jsonl", b'{"attempt": 2, "step": 10, "rank": 0}\n')
    store.put_bytes("metrics/002-r1-00001.jsonl", b'{"attempt": 2, "step": 10, "rank": 1}\n')
    store.put_bytes("logs/002-00001.log", b"node0 a\n")
    store.put_bytes("logs/002-00002.log", b"node0 b\n")
    store.put_bytes("logs/002-n1-00001.log", b"node1\n")
    return records


def test_a_run_recorded_with_the_literal_keys_reads_back_through_run_store(local_bucket: BucketHandle) -> None:
    store = _store(local_bucket)
    rec = _legacy(store)
    assert store.exists() and store.manifest()["run"] == store.run and store.find_manifest() == store.manifest()
    assert store.attempts() == [1, 2] and store.attempt(2) == {"attempt": 2}
    assert store.exit_record(2) == {"node": 0, "exit_code": 0} and store.exit_record(2, 1) == {"node": 1}
    assert store.exit_record(1) is None
    assert [e.get("restart") for e in store.errors(2)] == [None, 1]
    assert store.notices(2) == [{"rank": 0, "step": 9}]
    assert store.heartbeat()["rank"] == 0 and [b["rank"] for b in store.heartbeats(2)] == [0, 1]
    assert sorted(store.metrics()[2]) == [10, 11] and sorted(store.metrics(1)[2]) == [10]
    assert store.log_text(2) == "node0 a\nnode0 b\nnode1\n"
    assert store.log_text(2, 0) == "node0 a\nnode0 b\n" and store.log_text(2, 1) == "node1\n"
    assert [i["class"] for i in store.incidents()] == ["vm_lost", "ckpt_corrupt"]
    assert [r["k"] for r in store.recoveries()] == [9, 10]  # in the order made, not by name
    assert store.add_recovery({"k": 11}) == 3  # k counts the records, as before
    assert store.watch_state() == rec["watch/state.json"] and store.drill() == {"passed": False}
    assert [e["step"] for e in store.evaluations()] == [10, 20] and store.evaluations(last=1)[0]["final"]
    assert store.checkpoint_commits() == {20: rec["ckpt/step-20/COMMIT.json"]}
    assert store.checkpoint_object(20, "model.pt") == b"weights"


def test_old_shaped_records_read_through_their_types_and_write_back_as_they_were(local_bucket: BucketHandle) -> None:
    """What glue reads (Manifest, AttemptRecord, RecoveryRecord) from records an older gpukit wrote: the keys
    they lack read as empty, the keys they have that the types do not know are kept, and a record written
    back unchanged is the JSON it was."""
    store = _store(local_bucket)
    rec = _legacy(store)
    manifest = store.read_manifest()
    assert manifest.run == store.run and manifest.checkpoint == {"target": "s3://gpukit/runs/x"}
    assert manifest.environment == {} and manifest.workdir is None and manifest.outputs == {}
    second = store.latest_attempt()
    assert second is not None and (second.attempt, second.nodes, second.failure_class, second.ended) == (2, [], None,
                                                                                                         False)
    assert [r.to_dict() for r in store.read_recoveries()] == [{"k": 9}, {"k": 10}]
    store.put_manifest(manifest)
    store.put_attempt(second)
    assert store.manifest() == rec["manifest.json"] and store.attempt(2) == {"attempt": 2}
    second.update(failure_class="killed", reason="stopped on request (glue stop)")
    store.put_attempt(second)
    assert store.attempt(2) == {"attempt": 2, "failure_class": "killed", "reason": "stopped on request (glue stop)"}

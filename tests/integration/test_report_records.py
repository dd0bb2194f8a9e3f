"""Report, cost, verdict, compare and the scale gate, from run records in the real (rclone) bucket.

The records are written the way deploy, the trainer, the monitor and recover write them, with fixed
timestamps, so the figures can be checked against sums done by hand.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from glue.errors import GlueError
from glue.report import compare, cost, facts, html
from glue.runs import config as runconfig
from glue.runs import deploy, gate
from glue.runs.acceptance import run_acceptance
from glue.runs.store import RunStore
from glue.train import layout
from glue.train.run.evaluation import EvalSetError, load_eval_set, record_evaluation
from glue.train.storage.target import open_target

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def iso(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Ctx:
    """What the trainer's RunContext gives record_evaluation: attempt, rank, the run's storage."""

    def __init__(self, bucket: Any, run: str, attempt: int) -> None:
        self.attempt, self.rank = attempt, 0
        self.store = open_target(layout.run_uri("gpukit", run), endpoint_url=bucket.info.endpoint, region="us-east-1",
                                 credentials=lambda: bucket.creds, check=False)


def write_run(bucket: Any, run: str, sha: str, eval_sha: str | None = None, val_loss: float = 1.5) -> RunStore:
    """A run that lost its VM, was killed, and completed on its third attempt: 2 recoveries.
    attempt 1: 10:00 -> last step 25 at 10:25 (VM lost, no exit record)
    attempt 2: 10:40 -> last step 40 at 11:00 (killed, no exit record)
    attempt 3: 11:10 -> exit record 11:45 (completed)"""
    store = RunStore(bucket.info, bucket.creds, run)
    store.put_json(layout.MANIFEST, {
        "run": run, "created_at": iso(0), "image": None, "command": ["python", "-m", "glue.examples.tiny_gpt"],
        "config": {"config": {"steps": 60}, "pricing": {"vm_hour": 2.5, "currency": "EUR"},
                   "monitor": {"heartbeat_seconds": 1},
                   "evaluation": {"metrics": {"val_loss": {"max": 2.0}}}},
        "input": {"uri": "builtin://corpus", "version": "1"}, "code": {"git_sha": sha, "dirty": False},
        "environment": {"backend": "local", "gpu_type": "a100", "gpu_count": 2}, "distributed": None,
        "outputs": {"destination": f"{layout.run_uri('gpukit', run)}/{layout.OUTPUTS}", "required": ["model.pt"]},
        "checkpoint": {"target": layout.run_uri("gpukit", run), "interval_steps": 10, "keep_last": 2},
        "evaluation": {"dataset": {"uri": "s3://gpukit/eval/x", "sha256": eval_sha, "size": 1} if eval_sha else None,
                       "metrics": {"val_loss": {"max": 2.0}}},
    })
    spans = [(1, 0, range(1, 26), "vm_lost"), (2, 40, range(21, 41), "killed"), (3, 70, range(31, 61), None)]
    for n, start, steps, failure in spans:
        store.put_json(layout.attempt_key(n), {
            "run": run, "attempt": n, "vm": f"gpukit-{n}", "vm_id": f"vm{n}", "started_at": iso(start),
            "resume": n > 1, "nodes": [{"node": 0, "vm": f"gpukit-{n}"}], "failure_class": failure,
            "outcome": None if failure else "completed", "ended_at": iso(start + 100)})  # detected much later
        lines = [json.dumps({"step": s, "loss": 3.0 - s / 40, "attempt": n, "rank": 0,
                             "t": iso(start + s - steps[0] + 1)}) for s in steps]
        store.put_bytes(layout.metrics_key(n, 0, 0, 1), ("\n".join(lines) + "\n").encode())
    store.put_json(layout.exit_key(3, 0), {"attempt": 3, "node": 0, "exit_code": 0, "ended_at": iso(105)})
    for k, (prov, conf, ver, lost) in enumerate([(120, 240, 60, 5), (60, 180, 30, 0)], 1):
        store.put_json(layout.recovery_key(k), {
            "failed_attempt": k, "new_attempt": k + 1, "failure_class": spans[k - 1][3], "checkpoint_step": 20 + 10 * k,
            "seconds": {"detect": 30, "validate": 5, "provision": prov, "configure": conf, "verify": ver,
                        "restore": 30, "replay": 90}, "nodes": [{"node": 0, "replaced": True}],
            "work_lost": {"steps": lost, "seconds": lost * 60.0}, "verified": True})
    store.put_json(layout.commit_key(60), {
        "format": "gpukit-ckpt/1", "step": 60, "created_at": iso(104), "world_size": 1, "components": {},
        "timings": {"snapshot_s": 0.25, "wait_s": 0.05, "serialize_s": 1, "upload_s": 2, "verify_s": 0.5,
                    "bytes": 3 * 2**20}})
    store.put_bytes(f"{layout.OUTPUTS}/model.pt", b"weights")
    record_evaluation(Ctx(bucket, run, 3), 60, {"val_loss": val_loss}, final=True)
    return store


def test_cost_of_a_run_with_two_recoveries_is_the_hand_computed_sum(local_bucket: Any) -> None:
    store = write_run(local_bucket, f"cost-{uuid.uuid4().hex[:8]}", sha="c0ffee")
    res = cost.resources(facts.gather(store))
    # attempts: 25 + 20 + 35 min (a lost VM bills to its last step, not to when the loss was detected)
    # recoveries' new VMs: (120 + 240 + 60) + (60 + 180 + 30) s
    vm_hours = (25 * 60 + 20 * 60 + 35 * 60 + 420 + 270) / 3600  # 1.525
    assert res.vm_hours == pytest.approx(vm_hours)
    assert res.gpu_hours == pytest.approx(vm_hours * 2)
    assert res.cost == pytest.approx(1.525 * 2.5) and res.price.currency == "EUR"
    assert [u.label for u in res.uses] == ["attempt 1", "attempt 2", "attempt 3", "recovery 1", "recovery 2"]
    assert res.replayed_steps == 5 and res.replayed_s == pytest.approx(300)
    assert res.saves == 2 + 2 + 3  # steps 10, 20 | 30, 40 | 40, 50, 60 trained
    assert res.checkpoint_overhead_s == pytest.approx(7 * 0.3)


def test_a_warm_spare_a_recovery_took_is_charged_for_its_wait(local_bucket: Any) -> None:
    store = write_run(local_bucket, f"cost-{uuid.uuid4().hex[:8]}", sha="c0ffee")
    rec = store.get_json(layout.recovery_key(2))
    rec["spares"] = [{"vm": "gpukit-2", "spare": "gpukit-spare-1", "idle_since": iso(50), "taken_at": iso(70)}]
    rec["seconds"].update(provision=1, configure=0)
    store.put_json(layout.recovery_key(2), rec)
    res = cost.resources(facts.gather(store))
    assert [u.label for u in res.uses][-2:] == ["recovery 2", "spare gpukit-spare-1 (recovery 2)"]
    # the spare waited 20 min, ready since 10:50, taken at 11:10: charged as one VM's time
    assert res.uses[-1].vm_hours == pytest.approx(20 / 60) and res.uses[-1].gpu_hours == pytest.approx(40 / 60)
    assert res.vm_hours == pytest.approx((25 * 60 + 20 * 60 + 35 * 60 + 420 + 31 + 20 * 60) / 3600)


class Charts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, int]] = {}
        self.current = ""
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" or a.get("src") or (a.get("href") or "").startswith("http"):
            self.scripts += 1
        if tag == "svg" and a.get("data-chart"):
            self.current = str(a["data-chart"])
            self.charts[self.current] = {}
        if tag == "g" and a.get("data-series"):
            self.charts[self.current][str(a["data-series"])] = int(a.get("data-points") or 0)


def test_report_holds_every_chart_and_the_verdict(local_bucket: Any) -> None:
    store = write_run(local_bucket, f"rep-{uuid.uuid4().hex[:8]}", sha="c0ffee")
    page = html.build(facts.gather(store))
    parsed = Charts()
    parsed.feed(page)
    assert parsed.scripts == 0  # offline: nothing fetched, nothing run
    c = parsed.charts
    assert c["loss"] == {"attempt 1 (first, lost)": 25, "attempt 2 (resumed, lost)": 20, "attempt 3 (resumed)": 30}
    assert c["timeline"]["attempt"] == 3 and c["timeline"]["failure"] == 2 and c["timeline"]["recovery"] == 2
    assert c["timeline"]["checkpoint"] == 7
    assert c["recovery-phases"]["provision"] == 2 and c["work-lost"]["training replayed"] == 1
    assert c["checkpoint-stall"]["stall (training waits)"] == 1 and c["checkpoint-size"]["size"] == 1
    assert c["evaluation"] == {"val_loss": 1} and sum(c["step-gaps"].values()) == 24 + 19 + 29
    assert "badge ok" in page and "3.81 EUR" in page


def test_verdict_needs_completion_outputs_and_thresholds(local_bucket: Any) -> None:
    store = write_run(local_bucket, f"ver-{uuid.uuid4().hex[:8]}", sha="c0ffee", val_loss=2.5)
    v = run_acceptance(store)
    assert not v.accepted and v.reasons == ["val_loss = 2.5, needs ≤ 2"]
    record_evaluation(Ctx(local_bucket, store.run, 3), 60, {"val_loss": 1.9}, final=True)  # re-evaluated
    assert run_acceptance(store).accepted
    assert not run_acceptance(store, state="stall").accepted


def test_compare_refuses_runs_evaluated_on_different_sets(local_bucket: Any) -> None:
    a = facts.gather(write_run(local_bucket, f"cmp-a-{uuid.uuid4().hex[:6]}", sha="1", eval_sha="a" * 64))
    b = facts.gather(write_run(local_bucket, f"cmp-b-{uuid.uuid4().hex[:6]}", sha="2", eval_sha="b" * 64))
    with pytest.raises(GlueError, match="evaluated on different sets") as exc:
        compare.compare(a, b)
    assert "\n" not in str(exc.value)
    b.manifest.evaluation["dataset"]["sha256"] = "a" * 64
    b.manifest.config["config"]["steps"] = 80
    res = compare.compare(a, b)
    assert res["config_diff"] == [{"key": "config.steps", "a": 60, "b": 80}]
    assert res["a"]["cost"] == pytest.approx(3.8125) and res["a"]["code"] == "1" and res["b"]["code"] == "2"


def test_scale_gate_needs_an_accepted_smaller_run_and_a_passed_drill(local_bucket: Any) -> None:
    sha = uuid.uuid4().hex
    info, creds = local_bucket.info, local_bucket.creds
    assert not gate.validation(info, creds, sha, nodes=2).ok
    run = write_run(local_bucket, f"gate-{sha[:8]}", sha=sha).run
    found = gate.validation(info, creds, sha, nodes=2)
    assert found.accepted_run == run and found.passed_drill is None and "no drill" in found.missing()
    drill = RunStore(info, creds, f"gate-{sha[:8]}-drill1")
    drill.put_json(layout.MANIFEST, {"run": drill.run, "code": {"git_sha": sha}, "distributed": None})
    drill.put_json(layout.DRILL, {"passed": True})
    assert gate.validation(info, creds, sha, nodes=2).ok
    assert not gate.validation(info, creds, sha, nodes=1).ok  # "smaller" than one VM: nothing is
    # deploy's gate is on this checkout's commit, which no run in this bucket validated
    with pytest.raises(GlueError, match="scale gate: refusing --nodes 2") as exc:
        deploy.scale_gate(drill, 2, require_validated=True, console=Console(stderr=True))
    assert "\n" not in str(exc.value)


def test_eval_set_is_pinned_at_deploy_and_checked_by_the_trainer(local_bucket: Any, tmp_path: Path) -> None:
    key = f"eval/heldout-{uuid.uuid4().hex[:8]}.txt"
    data = b"the model trains the weights before dawn.\n" * 20
    pin = hashlib.sha256(data).hexdigest()
    s3 = local_bucket.client()
    s3.put_object(Bucket="gpukit", Key=key, Body=data)
    store = RunStore(local_bucket.info, local_bucket.creds, "pin-check")

    def rc(uri: str, sha: str) -> runconfig.RunConfig:
        return runconfig.parse({"command": ["true"], "outputs": {"destination": "s3://{bucket}/runs/{run}/o"},
                                "checkpoint": {"target": "s3://{bucket}/runs/{run}"},
                                "evaluation": {"dataset": {"uri": uri, "sha256": sha},
                                               "metrics": {"val_loss": {"max": 3}}}}, "pin-check", "gpukit")

    assert deploy.check_eval_set(store, rc("s3://{bucket}/" + key, pin)) == {
        "uri": f"s3://gpukit/{key}", "sha256": pin, "size": len(data)}
    with pytest.raises(GlueError, match=r"run\.yaml pins 0000") as exc:
        deploy.check_eval_set(store, rc(f"s3://gpukit/{key}", "0" * 64))
    assert "\n" not in str(exc.value)
    with pytest.raises(GlueError, match="is not in bucket gpukit"):
        deploy.check_eval_set(store, rc("s3://gpukit/eval/missing.txt", pin))
    with pytest.raises(GlueError, match="not an object in the run's bucket"):
        deploy.check_eval_set(store, rc("s3://elsewhere/x.txt", pin))

    cred_file = tmp_path / "creds.json"
    cred_file.write_text(json.dumps({"access_key": local_bucket.creds.access_key,
                                     "secret_key": local_bucket.creds.secret_key}))
    env = {"GPUKIT_EVAL_URI": f"s3://gpukit/{key}", "GPUKIT_EVAL_SHA256": pin, "GPUKIT_CREDENTIALS_FILE":
           str(cred_file), "GPUKIT_BUCKET_ENDPOINT": local_bucket.info.endpoint, "GPUKIT_BUCKET_REGION": "us-east-1"}
    assert load_eval_set(env) == data and load_eval_set({}) is None
    s3.put_object(Bucket="gpukit", Key=key, Body=data + b"changed")  # replaced after deploy
    with pytest.raises(EvalSetError, match="changed after deploy"):
        load_eval_set(env)

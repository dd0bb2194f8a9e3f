"""The resubmission decision after the Slurm head was lost (glue.scheduler.slurm.resubmit): a run whose job
the head's new controller does not know is resubmitted only when it was queued (a fresh start) or running
(resumed); one that ended stays ended; a missing secret is one line and nothing is submitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glue.errors import GlueError
from glue.runs import config as runconfig
from glue.runs.records import AttemptRecord
from glue.scheduler.slurm import resubmit
from glue.train import layout
from glue.train import trainer_vars as V
from glue.train.run.launch import SpecBucket, TrainerEnv
from glue.train.run.notice import PREEMPTED_EXIT
from glue.train.run.slurm_job import Allocation, SlurmJobSpec, attempt_record, launch_spec, notice_file

ROOT = Path(__file__).resolve().parents[2]
OLD_HEAD, NEW_HEAD = "vm-old-head", "vm-new-head"
SCHED = {"name": "slurm", "job_id": "4", "submitted_at": "2026-12-06T20:00:00Z", "sbatch": [],
         "head_vm_id": OLD_HEAD}


def attempt(**ended: Any) -> AttemptRecord:
    rec = AttemptRecord(run="r1", attempt=1, vm="gpukit-2", vm_id="vm-2", backend="local", resume=False, nodes=[])
    rec.update(**ended)
    return rec


def test_a_job_the_same_head_forgot_has_ended_whatever_the_records_say() -> None:
    for latest in (None, attempt()):
        got = resubmit.decide(SCHED, OLD_HEAD, latest, None)
        assert (got.action, got.submits) == ("ended", False), got


def test_a_queued_run_is_resubmitted_as_a_fresh_start() -> None:
    got = resubmit.decide(SCHED, NEW_HEAD, None, None)
    assert (got.action, got.submits) == ("fresh", True) and "never started" in got.why


def test_a_running_run_is_resubmitted_resumed() -> None:
    # Still running when the head went (no exit record), killed by the new controller as an orphan or by glue
    # before the resubmission (a signal), saved on Slurm's notice, or already classed lost.
    for exit_rec in (None, {"exit_code": None, "signal": 15, "oom_kills": 0}, {"exit_code": PREEMPTED_EXIT}):
        got = resubmit.decide(SCHED, NEW_HEAD, attempt(), exit_rec)
        assert (got.action, got.submits) == ("resume", True), (exit_rec, got)
    for cls in ("vm_lost", "preempted", "killed"):  # killed: from outside (an orphan of the lost controller)
        assert resubmit.decide(SCHED, NEW_HEAD, attempt(failure_class=cls), None).action == "resume"


def test_an_ended_run_stays_ended() -> None:
    cases = [(attempt(outcome="completed"), None), (attempt(), {"exit_code": 0}),
             (attempt(), {"exit_code": 1}), (attempt(failure_class="oom_gpu"), None),
             (attempt(failure_class="bad_restart"), None), (attempt(failure_class="user_error"), None),
             (attempt(), {"exit_code": None, "signal": 9, "oom_kills": 1})]
    for latest, exit_rec in cases:
        got = resubmit.decide(SCHED, NEW_HEAD, latest, exit_rec)
        assert (got.action, got.submits) == ("ended", False), (latest, exit_rec, got)
    cancelled = {**SCHED, "cancelled_at": "2026-12-06T20:01:00Z"}  # `glue stop`, of a pending or a running job
    assert resubmit.decide(cancelled, NEW_HEAD, None, None).action == "ended"
    assert resubmit.decide(cancelled, NEW_HEAD, attempt(failure_class="killed"), None).action == "ended"


def test_a_record_without_the_heads_id_is_resubmitted_only_when_this_pass_replaced_the_head() -> None:
    old = {k: v for k, v in SCHED.items() if k != "head_vm_id"}
    assert resubmit.decide(old, NEW_HEAD, attempt(), None, head_replaced=True).action == "resume"
    assert resubmit.decide(old, NEW_HEAD, attempt(), None, head_replaced=False).action == "ended"


def test_the_new_job_goes_into_the_scheduler_record_the_old_ones_kept() -> None:
    once = resubmit._record(SCHED, "3", NEW_HEAD, "lost with the head")
    twice = resubmit._record(once, "7", "vm-newer", "lost again")
    assert (twice["job_id"], twice["head_vm_id"], twice["sbatch"]) == ("7", "vm-newer", [])
    assert [(h["job_id"], h["head_vm_id"]) for h in twice["history"]] == [("4", OLD_HEAD), ("3", NEW_HEAD)]


def test_a_missing_secret_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = yaml.safe_load((ROOT / "examples" / "tiny_gpt.yaml").read_text())
    rc = runconfig.parse({**raw, "secrets": ["WANDB_API_KEY"]}, "r1", "gpukit")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(GlueError) as err:
        resubmit.missing_secret("r1", rc)
    line = str(err.value)
    assert "\n" not in line and "secret WANDB_API_KEY is not set" in line and "nothing submitted" in line, line
    monkeypatch.setenv("WANDB_API_KEY", "x")
    resubmit.missing_secret("r1", rc)


def test_a_resubmitted_jobs_first_start_is_the_runs_next_attempt_resumed() -> None:
    """On the node: a job glue resubmitted at attempt 3 (resume) starts as attempt 3, resumed, and its later
    Slurm restarts count on from there."""
    target = layout.run_uri("b", "r1")
    env = TrainerEnv(run="r1", checkpoint=target, outputs=f"{target}/{layout.OUTPUTS}", bucket_name="b")
    spec = SlurmJobSpec(run="r1", first_attempt=3, resume=True, command=["/opt/gpukit/venv/bin/python", "-m", "x"],
                        env=env.to_env(), bucket=SpecBucket(name="b"), credentials_file="/run/gpukit/c.json",
                        credentials="{}", image_python="/opt/gpukit/venv/bin/python", scratch="/tmp",
                        backend="local", vm_ids={"gpukit-1": "id-1"})
    start = Allocation(job_id="3", restart_count=0, nodelist="gpukit-1", node="gpukit-1", gpus="0")
    launch = launch_spec(spec, start, 3, None, notice_file("r1", "3"))
    assert (launch.attempt, launch.env[V.ATTEMPT], launch.env[V.RESUME]) == (3, "3", "1")
    assert attempt_record(spec, start, 3)["resume"] is True
    requeued = Allocation(job_id="3", restart_count=1, nodelist="gpukit-2", node="gpukit-2", gpus="0")
    assert launch_spec(spec, requeued, 4, None, notice_file("r1", "3")).env[V.ATTEMPT] == "4"

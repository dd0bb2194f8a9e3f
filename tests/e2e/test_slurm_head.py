"""Losing the Slurm head loses no run. A cluster of its own (`glue up --vms 2 --scheduler slurm`: the head
gpukit-1 and gpukit-2, one stand-in GPU each), two runs training (one on each node), then gpukit-1's VM
destroyed: slurmctld's queue goes with its disk. `glue recover --run short` replaces the head (a fresh
slurmctld that knows no job) and resubmits its run from the bucket's records as its next attempt, resumed
from the newest valid checkpoint; one pass of `glue watch` resubmits the other; both complete, and each
resubmission's resume is verified (first resumed step = checkpoint + 1, equal losses) in the run's
recovery record. A third run, queued behind them when the head went (it never started), is resubmitted
by `glue recover` as a fresh start: its first attempt, from step 0, completes."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.runs.store import RunStore
from tests.integration.test_runs import here, run_config
from tests.kit import GLUE

from .conftest import Kit
from .test_slurm_runs import on_head, slurm_cluster, squeue, wait

pytestmark = pytest.mark.e2e
LINE = re.compile(r"head gpukit-1 lost: replaced; run (\S+) resubmitted as job (\d+), resumes from step (\d+)")
LINE_FRESH = re.compile(r"head gpukit-\d lost: replaced; run (\S+) resubmitted as job (\d+), starts from step 0 "
                        r"\(it never started\)")


@pytest.fixture(scope="module")
def head_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    yield from slurm_cluster(tmp_path_factory, "slurm-head", 2)


def step_of(store: RunStore) -> int:
    return int((store.heartbeat(0) or {}).get("step") or 0)


def shipped(store: RunStore) -> int:
    """The last step of attempt 1 whose metrics reached the bucket (the trainer ships them every 5 s)."""
    return max(store.metrics(0).get(1, {}) or [0])


# `stress` (make test-all, since 2026-12-07: the suite's time): make test has Slurm's recovery of a lost node
# (tests/e2e/test_slurm_runs.py); this adds the head's own loss, on a cluster of its own.
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_a_lost_head_is_replaced_and_both_runs_resubmitted_resumed_and_verified(head_kit: Kit, tmp_path: Path) -> None:
    kit, fast = head_kit, here(head_kit)
    # `long` trains on gpukit-2 past the head's replacement (it must still run when its watch pass comes, after
    # three deploys and the head's replacement: 800 steps of 0.2 s); `short`
    # trains on the head. Placed by draining: `long` first while gpukit-1 is held out, then `short` on the
    # only GPU left.
    configs = {run: run_config(tmp_path, f"{run}.yaml", config={"steps": steps, "step_sleep": 0.2},
                               checkpoint={"interval_steps": 20})
               for run, steps in (("long", 800), ("short", 100))}
    stores = {run: RunStore.open(kit.home, run) for run in configs}
    on_head(kit, "scontrol update nodename=gpukit-1 state=drain reason=e2e-placement")
    queued = RunStore.open(kit.home, "queued")
    try:
        kit.glue("deploy", "--run", "long", "--config", str(configs["long"]))
        # short's deploy (its preflight: tens of seconds here) meanwhile; its job waits for gpukit-1
        short = subprocess.Popen([*GLUE, "deploy", "--run", "short", "--config", str(configs["short"])],
                                 env=kit.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL)
        assert wait("long's attempt 1", lambda: stores["long"].attempt(1) or None, 180)["vm"] == "gpukit-2"
        _, err = short.communicate(timeout=300)
        assert short.returncode == 0 and "submitted to Slurm as job" in err, err
        # A third run, submitted after short's job while gpukit-1 is held out: once it returns, short's job
        # (first in line) takes its GPU and `queued` waits in the queue; it never starts before the head goes.
        queued_cfg = run_config(tmp_path, "queued.yaml", config={"steps": 30, "step_sleep": 0.2},
                                checkpoint={"interval_steps": 20})
        res = kit.glue("deploy", "--run", "queued", "--config", str(queued_cfg))
        assert "submitted to Slurm as job" in res.stderr, res.stderr
    finally:
        on_head(kit, "scontrol update nodename=gpukit-1 state=resume")
    assert wait("short's attempt 1", lambda: stores["short"].attempt(1) or None, 180)["vm"] == "gpukit-1"
    # The head goes while `short`'s shipped metrics are a few steps past its newest checkpoint: its resumed
    # losses then have steps to be compared with.
    wait("a checkpoint in both, short's metrics shipped past it", lambda: step_of(stores["long"]) >= 21 and
         21 <= shipped(stores["short"]) <= 90 and 1 <= shipped(stores["short"]) % 20 <= 8, 180)
    assert squeue(kit)["queued"]["state"] == "PENDING" and queued.attempts() == [], squeue(kit)
    old_jobs = {run: s.read_manifest().scheduler["job_id"] for run, s in stores.items()}  # type: ignore[index]

    head_id = next(v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"] if v["name"] == "gpukit-1")
    lost_at = time.monotonic()
    LocalBackend(kit.home).delete_vm(head_id)
    said: dict[str, re.Match[str]] = {}
    took: dict[str, float] = {}
    # `glue recover` replaces the head and resubmits its run; the watcher (one pass) resubmits the other.
    for run, command in (("short", ("recover", "--run", "short")), ("long", ("watch", "--once", "--run", "long"))):
        t0 = time.monotonic()
        out = kit.glue(*command, timeout=600)
        took[run] = time.monotonic() - t0
        found = LINE.search(" ".join(out.stderr.split()))
        assert found and found.group(1) == run, out.stderr
        said[run] = found
        if run == "short":  # the new head knows no job of long's yet: glue status says it was lost with the queue
            rows = {r["run"]: r for r in json.loads(fast.glue("status", "--json").stdout)["slurm"]["runs"]}
            assert rows["long"]["state"] == "LOST" and "resubmits it" in rows["long"]["reason"], rows
    recovered_s = time.monotonic() - lost_at

    for run, store in stores.items():
        found = said[run]
        sched = store.read_manifest().scheduler or {}
        assert sched["job_id"] == found.group(2) and [h["job_id"] for h in sched["history"]] == [old_jobs[run]]
        second = wait(f"{run}'s resubmitted start", lambda s=store: s.attempt(2) or None, 240)
        assert second["scheduler"]["job_id"] == found.group(2) and second["resume"], second
        assert second["scheduler"]["resume_from"] == int(found.group(3)) >= 20, second
    for store in stores.values():
        wait(f"{store.run} ends", lambda s=store: s.exit_record(2, 0), 300)
    done_s = time.monotonic() - lost_at
    fast.glue("status", "--json")  # judges each restart's resume as it shows the queue
    for run, store in stores.items():
        assert store.exit_record(2, 0)["exit_code"] == 0  # type: ignore[index]
        st = json.loads(fast.glue("status", "--run", run, "--json").stdout)
        assert st["state"] == "completed", st
        rec = store.recoveries()[-1]
        ckpt = int(said[run].group(3))
        assert (rec["failed_attempt"], rec["new_attempt"], rec["failure_class"]) == (1, 2, "vm_lost"), rec
        assert rec["verified"] and rec["checkpoint_step"] == ckpt and rec["first_resumed_step"] == ckpt + 1, rec
        assert rec["resume_check"]["by"] == "slurm resubmission", rec
        # Every step the lost attempt shipped past the checkpoint is compared. short went inside a window
        # that guarantees some; long was killed as an orphan when its slurmd met the new head, a moment no
        # test controls, sometimes before it shipped any step past its checkpoint (then none can be).
        assert rec["compared_steps"] if run == "short" else \
            max(rec["compared_steps"], default=ckpt) == max(shipped(store), ckpt), (shipped(store), rec)
        assert store.attempts() == [1, 2]
    print(f"\nhead lost -> recover (head replaced, short resubmitted) {took['short']:.1f} s, watch --once (long "
          f"resubmitted) {took['long']:.1f} s; both resubmitted {recovered_s:.1f} s; both completed {done_s:.1f} s")
    # The queued run: resubmitted as a fresh start (it never started), its first attempt completes.
    out = kit.glue("recover", "--run", "queued", timeout=300)
    found = LINE_FRESH.search(" ".join(out.stderr.split()))
    assert found and found.group(1) == "queued", out.stderr
    wait("queued ends", lambda: queued.exit_record(1, 0), 300)
    assert queued.exit_record(1, 0)["exit_code"] == 0 and queued.attempts() == [1]  # type: ignore[index]
    assert not queued.attempt(1)["resume"] and queued.recoveries() == []  # type: ignore[index]
    assert json.loads(fast.glue("status", "--run", "queued", "--json").stdout)["state"] == "completed"
    # Nothing more to do: a second recover reads the run completed (its job ended on the new head).
    again = kit.glue("recover", "--run", "short", timeout=300)
    assert "ended: completed" in again.stderr, again.stderr

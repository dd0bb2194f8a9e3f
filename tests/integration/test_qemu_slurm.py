"""Slurm on a qemu VM runs the standard cgroup plugins, which nspawn machines cannot (no cgroup delegation there:
tests/e2e/test_slurm_runs.py's cluster tracks jobs by /proc): one VM as head and node (`glue up --backend qemu
--scheduler slurm`), `proctrack/cgroup`, `task/cgroup,task/affinity`, `jobacct_gather/cgroup` and a cgroup/v2
`cgroup.conf`; a run's trainer lives in its job's cgroup, and `glue stop` (scancel) leaves no process of it.
Minutes of emulation (a converge with the slurm role, torch's import in the guest): a `stress` test (make
test-all); make test runs the same role, templates and runs on local VMs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from glue.runs.store import RunStore
from tests.integration.test_runs import run_config
from tests.kit import Kit

pytestmark = [pytest.mark.integration, pytest.mark.stress]


def _on_vm(kit: Kit, command: str) -> list[str]:
    return kit.glue("ssh", "gpukit-1", "--", "sh", "-c", command, timeout=180).stdout.split("\n")


def _wait(what: str, pred: object, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()  # type: ignore[operator]
        if got:
            return got
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


@pytest.mark.timeout(3600)
def test_slurm_on_a_qemu_vm_tracks_a_run_by_its_jobs_cgroup_and_scancel_ends_it(qemu_kit: Kit,
                                                                                 tmp_path: Path) -> None:
    kit = qemu_kit
    kit.glue("up", "--backend", "qemu", "--vms", "1", "--scheduler", "slurm", timeout=2400)
    conf = _on_vm(kit, "scontrol show config | grep -E '^(ProctrackType|TaskPlugin|JobAcctGatherType) ' "
                       "| tr -s ' '; grep -c '^CgroupPlugin=cgroup/v2' /etc/slurm/cgroup.conf")
    assert conf[:4] == ["JobAcctGatherType = jobacct_gather/cgroup", "ProctrackType = proctrack/cgroup",
                        "TaskPlugin = task/cgroup,task/affinity", "1"], conf

    # Under emulation torch's import takes minutes: not a stall.
    cfg = run_config(tmp_path, config={"steps": 2000, "step_sleep": 0.5, "batch_size": 2, "seq_len": 16,
                                       "d_model": 16, "n_layer": 1, "n_head": 2},
                     resources={"gpus_per_node": 1, "time": "01:00:00"},
                     monitor={"heartbeat_seconds": 1, "stall_timeout_seconds": 1800})
    kit.glue("deploy", "--run", "qs", "--config", str(cfg), timeout=900)
    store = RunStore.open(kit.home, "qs")
    record = _wait("the trainer's first step", lambda: (store.heartbeat() or {}).get("step") and store.attempt(1),
                   1500)
    assert isinstance(record, dict)
    job = str(record["scheduler"]["job_id"])
    pid = int(record["trainer_pid"])
    # The trainer is in its job's cgroup (slurmd put the step there): Slurm counts and kills it by that.
    [cgroup] = [line for line in _on_vm(kit, f"cat /proc/{pid}/cgroup") if line]
    assert f"/job_{job}/" in cgroup, cgroup
    out = kit.glue("stop", "--run", "qs", timeout=300)
    assert "cancelled (scancel)" in out.stderr, out.stderr
    _wait("no process of the run left", lambda: _on_vm(kit, "pgrep -f 'glue[.]examples[.]tiny_gpt' || echo none")[0]
          == "none", 300)
    assert json.loads(kit.glue("status", "--run", "qs", "--json").stdout)["state"] == "killed"
    kit.glue("down", "--force", timeout=300)  # the stopped run has no outputs: its data stays in the bucket

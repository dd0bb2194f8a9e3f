"""The trainers people use, deployed through glue: a Hugging Face Trainer job (examples/hf_trainer) on
one VM and a Lightning job (examples/lightning) on the other, their frameworks installed from the
bucket's wheelhouse. Both VMs are destroyed mid-run; `glue recover` brings each back on a new VM from
its newest sealed checkpoint and the resume check finds the per-step losses equal to those before the
failure (bitwise: both are deterministic on CPU; Lightning's random streams kept by GlueCallback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from glue.cloud.local.backend import LocalBackend
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.integration.test_runs import ROOT, here, s3, status, wait_for

from .conftest import Kit

# `stress` (make test-all): ~2.5 min. make test proves the parts apart: each framework's resume, bitwise, without
# a VM (tests/integration/test_hf_trainer.py, test_lightning_trainer.py), and a job with its own requirements
# from the bucket's wheelhouse recovered onto another VM (tests/e2e/test_own_job.py).
pytestmark = [pytest.mark.e2e, pytest.mark.stress]
# run -> (example, VM, the file a sealed checkpoint of step 20 must hold)
JOBS = {"hf": ("hf_trainer", "gpukit-2", "files/trainer_state.json"),
        "pl": ("lightning", "gpukit-1", "files/epoch=0-step=20.ckpt")}
HOLD = 23


def _project(tmp_path: Path, example: str) -> Path:
    proj = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, proj)
    cfg = yaml.safe_load((proj / "run.yaml").read_text())
    cfg["config"].update(steps=40, step_sleep=0.05)
    cfg["env"]["GPUKIT_HOLD_AT"] = f"1:{HOLD}"  # the first attempt stops dead after step 23: the VM dies there
    (proj / "run.yaml").write_text(yaml.safe_dump(cfg))
    return proj


def _json(client: Any, key: str) -> Any:
    return bucket_store.read_json(client, "gpukit", key)


@pytest.mark.timeout(1200)
def test_trainer_and_lightning_jobs_recover_on_new_vms_from_their_sealed_checkpoints(cluster_kit: Kit,
                                                                                     tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    for run, (example, vm, _) in JOBS.items():
        proj = _project(tmp_path, example)
        kit.glue("deploy", "--run", run, "--config", str(proj / "run.yaml"), "--vm", vm, timeout=900)
    try:
        for run, (_, _, sealed) in JOBS.items():
            wait_for(fast, run, lambda s: s["step"] == HOLD, timeout=400)
            commit = _json(client, layout.run_prefix(run) + layout.commit_key(20))
            assert commit is not None and sealed in {o["key"] for o in commit["components"]["files"]}, commit
        vms = {v["name"]: v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"]}
        for _, vm, _ in JOBS.values():
            LocalBackend(kit.home).delete_vm(vms[vm])
        for run in JOBS:
            res = kit.glue("recover", "--run", run, timeout=900, check=False)
            log = kit.glue("logs", "--run", run, "--attempt", "2").stdout
            assert res.returncode == 0 and "resume verified" in res.stderr, res.stderr + log[-3000:]
            rec = _json(client, layout.run_prefix(run) + layout.recovery_key(1))
            assert rec["verified"] and rec["checkpoint_step"] == 20 and rec["failure_step"] == HOLD, rec
            assert rec["compared_steps"] == [21, 22, 23], rec
            assert rec["first_resumed_step"] == rec["checkpoint_step"] + 1 and rec["compared_steps"], rec
        for run in JOBS:
            wait_for(fast, run, lambda s: s["state"] == "completed", timeout=300)
            assert status(fast, run)["state"] == "completed"
            # The log is shipped every few seconds: read once the attempt has ended, it is whole.
            log = kit.glue("logs", "--run", run, "--attempt", "2").stdout
            assert "resuming from sealed checkpoint" in log, log[-2000:]
    finally:
        for _, vm, _ in JOBS.values():
            fast.glue("ssh", vm, "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)

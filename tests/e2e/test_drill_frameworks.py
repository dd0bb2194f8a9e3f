"""`glue drill` on framework checkpoints: the Hugging Face Trainer example and the Lightning example each run
twice on the session's local VMs (a reference, and a run whose VM is destroyed and recovered onto a new one),
and their final sealed checkpoints compare equal by what they hold (safetensors tensors, optimizer,
scheduler and RNG states, JSON fields). A job whose checkpoint holds an object the drill cannot read (a
pickle weights_only refuses, different in the two runs) ends in one line naming it, exit 1, no traceback."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from glue.runs.store import RunStore
from tests.integration.test_runs import ROOT

from .conftest import Kit

pytestmark = pytest.mark.e2e
STEPS, KILL_AT = 30, 15  # the examples checkpoint every 10 steps: the drill run resumes from step 10
# The pickled job checkpoints every 4 steps: 12 steps, its VM destroyed at step 6, resumed from step 4.
JOB_STEPS, JOB_KILL_AT = 12, 6

# A job sealing its own folder (FolderCheckpoints): its state in state.pt, and beside it a pickle of an object
# torch.load(weights_only=True) refuses, which names the run that wrote it (so the two runs' bytes differ).
JOB = '''
import time
from fractions import Fraction

import torch

from glue.train import RunContext


def main() -> None:
    with RunContext.from_env() as ctx:
        steps, interval = int(ctx.config["steps"]), ctx.checkpoint_interval
        sealed = ctx.folder_checkpoints()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        start = 0
        fetched = sealed.fetch(ctx.scratch / "restore") if ctx.resume else None
        if fetched is not None:
            state = torch.load(fetched.path / "state.pt", weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = fetched.step
        for step in range(start + 1, steps + 1):
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.step(step, loss.item())
            time.sleep(float(ctx.config.get("step_sleep", 0)))
            if step % interval == 0 or step == steps:
                folder = ctx.scratch / f"ckpt-{step}"
                folder.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, folder / "state.pt")
                torch.save({"written_by": ctx.run, "share": Fraction(1, 3)}, folder / "meta.pt")
                sealed.seal(step, folder)
        sealed.close()
        ctx.write_output("final.json", b"{}")


if __name__ == "__main__":
    main()
'''


def _example(tmp_path: Path, example: str) -> Path:
    proj = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, proj)
    return proj / "run.yaml"


def _job(tmp_path: Path) -> Path:
    proj = tmp_path / "pickled"
    proj.mkdir()
    (proj / "train.py").write_text(JOB)
    cfg: dict[str, Any] = {"command": ["python", "train.py"], "workdir": ".", "config": {"step_sleep": 0.05},
                           "outputs": {"destination": "s3://{bucket}/runs/{run}/outputs", "required": ["final.json"]},
                           "checkpoint": {"target": "s3://{bucket}/runs/{run}", "interval_steps": 4},
                           "env": {"OMP_NUM_THREADS": "1"}, "monitor": {"heartbeat_seconds": 1}}
    (proj / "run.yaml").write_text(yaml.safe_dump(cfg))
    return proj / "run.yaml"


def _drill(kit: Kit, run: str, config: Path, steps: int = STEPS, kill_at: int = KILL_AT) -> tuple[Any, dict[str, Any]]:
    res = kit.glue("drill", "--run", run, "--config", str(config), "--steps", str(steps), "--kill-at", str(kill_at),
                   check=False, timeout=900)
    record = RunStore.open(kit.home, f"{run}-drill1").drill() or {}
    return res, record


# `stress` (make test-all): 685 s (Trainer) + 405 s (Lightning) here on 2 cores under a load of ~12 (each
# deploy builds and installs the example's wheels; each drill trains twice and recovers once). make test proves
# the parts apart: the comparison of real Trainer and Lightning checkpoints resumed from an earlier one
# (tests/unit/test_drill_framework_folders.py), a drill over a sealed folder ending in its verdict (below), and
# a drill of gpukit's own format (test_report_drill).
@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_drills_of_the_trainer_and_lightning_examples_pass_by_what_their_checkpoints_hold(cluster_kit: Kit,
                                                                                        tmp_path: Path) -> None:
    kit = cluster_kit
    for run, example, sealed_file in (("hfd", "hf_trainer", "files/model.safetensors"),
                                      ("pld", "lightning", f"files/epoch=0-step={STEPS}.ckpt")):
        t0 = time.monotonic()
        res, rec = _drill(kit, run, _example(tmp_path, example))
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-4000:]
        assert rec["passed"] and rec["verdict"] == "pass" and rec["warnings"] == [], rec
        assert rec["compared_steps"] == STEPS and rec["recovery"]["checkpoint_step"] == 10, rec
        assert rec["compared_tensors"] > 10 and "could not compare" not in rec["compared"], rec
        final = RunStore.open(kit.home, f"{run}-drill1").checkpoint_object(STEPS, sealed_file)
        assert final, f"{sealed_file} is not in {run}-drill1's final sealed checkpoint"
        if example == "hf_trainer":  # the Trainer's settings pickle is named as not compared
            assert "not compared: files/training_args.bin" in rec["compared"], rec
        print(f"drill of {example}: {time.monotonic() - t0:.0f}s")


# `stress` (make test-all, since 2026-12-07): make test compares the objects a checkpoint holds, and names the one it
# cannot, in tests/unit/test_drill_framework_folders.py, and runs a drill end to end in test_report_drill.py.
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_a_drill_whose_checkpoint_holds_an_object_it_cannot_compare_ends_in_one_line(cluster_kit: Kit,
                                                                                   tmp_path: Path) -> None:
    t0 = time.monotonic()
    res, rec = _drill(cluster_kit, "pickled", _job(tmp_path), JOB_STEPS, JOB_KILL_AT)
    print(f"drill of the pickled job: {time.monotonic() - t0:.0f}s")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-4000:]
    problem = rec["problem"]
    assert problem.startswith("could not compare files/meta.pt: a pickle torch.load(weights_only=True) refuses"), rec
    assert "fractions.Fraction" in problem and "\n" not in problem, problem
    assert rec["verdict"] == "uncomparable" and rec["compared_steps"] == JOB_STEPS, rec  # every loss compared
    assert "files/state.pt" not in rec["compared"], rec  # state.pt was compared (and equal)
    assert "could not compare: files/meta.pt" in " ".join(res.stderr.split()), res.stderr[-3000:]

"""The RunContext in probe mode (glue.train.run.probe), as a memprobe trial of a user's own job runs it: the
trainer stops itself after K whole steps, writes nothing to the run's bucket records, measures the step by
phase and part (the parts add up to the peak), and says how it failed. Also: a run's own config and remedies
as memprobe takes them, and the reproducer. The trainer is a real subprocess with the probe variables set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from glue.errors import GlueError
from glue.memprobe import investigate, remedies, source
from glue.memprobe.runner import ERROR, FIT, OOM, TrialOutcome, run_command
from glue.runs.records import Manifest
from glue.train import trainer_vars as V
from glue.train.run.launch import TrainerEnv

TRAINER = '''
import torch
from torch import nn
from glue.train import RunContext
from glue.runs.records import Manifest

with RunContext.from_env() as ctx:
    cfg = ctx.config
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]))
    ckpt = ctx.checkpointer()
    ckpt.register("model", model)
    ckpt.register("optimizer", opt)
    for step in range(1, 1000):
        if step == cfg.get("fail_at"):
            raise MemoryError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes")
        x = torch.randn(int(cfg["batch_size"]), 512)
        loss = nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        del x, loss  # this batch is gone before the next one is drawn
        ckpt.save(step)
        ctx.step(step, value)
    raise SystemExit("the probe did not stop the trainer")
'''

HF_TRAINER = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from glue.train import RunContext
from glue.train.integrations.hf import GlueCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq):
        self.x = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


with RunContext.from_env() as ctx:
    cfg = ctx.config
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(ctx.scratch / "hf"), max_steps=50, logging_steps=1, report_to=[],
                             use_cpu=True, save_steps=1000, seed=0,
                             per_device_train_batch_size=int(cfg["per_device_train_batch_size"]),
                             gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)))
    Trainer(model=model, args=args, train_dataset=Tokens(512, 32), callbacks=[GlueCallback(ctx)]).train()
    print("trainer returned", flush=True)
'''


def _trial(tmp_path: Path, cfg: dict[str, Any], steps: int = 3,
           trainer: str = TRAINER) -> tuple[TrialOutcome, dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(trainer)
    folder = tmp_path / "probe"
    folder.mkdir()
    env = {**TrainerEnv(run="r", checkpoint=str(tmp_path / "ckpt"), outputs=str(tmp_path / "out"),
                        bucket_name="no-such-bucket", config=cfg, scratch=str(tmp_path / "scratch")).to_env(),
           V.PROBE_DIR: str(folder), V.PROBE_STEPS: str(steps), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = run_command([sys.executable, str(script)], {}, env=env,
                      result_path=folder / "result.json", limit_mb=None, timeout_s=300)
    return out, json.loads((folder / "result.json").read_text())


def test_a_probed_trainer_stops_after_k_steps_and_its_parts_add_up_to_the_peak(tmp_path: Path) -> None:
    out, res = _trial(tmp_path, {"batch_size": 2048, "lr": 0.01})
    assert out.status == FIT and out.exit == 0 and res["steps_run"] == 3  # stopped cleanly by ctx.step
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("*.json"))  # no checkpoint saved
    b = res["breakdown"]
    parts = b["at_peak_mb"]
    assert b["peak_phase"] in ("forward", "backward") and set(b["phase_peak_mb"]) >= {"forward", "backward",
                                                                                       "optimizer"}
    assert sum(parts.values()) == pytest.approx(b["peak_mb"], abs=0.01)  # `other` is shown, never dropped
    weights = (512 * 64 + 64 + 64 + 1) * 4 / 2**20
    assert parts["weights"] == pytest.approx(weights, rel=0.01)
    assert parts["gradients"] == pytest.approx(weights, rel=0.01)
    assert parts["optimizer_state"] == pytest.approx(2 * weights, rel=0.01)
    assert parts["activations"] >= 2048 * 512 * 4 / 2**20  # the input autograd saved for the first layer
    assert res["model"]["parameters"] == 512 * 64 + 64 + 64 + 1


def test_a_probed_trainer_reports_out_of_memory_and_other_errors(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    out, res = _trial(tmp_path / "a", {"batch_size": 64, "lr": 0.01, "fail_at": 2})
    assert out.status == OOM and "can't allocate memory" in (out.error or "") and res["steps_run"] == 1
    out, res = _trial(tmp_path / "b", {"batch_size": 64, "lr": "oops"})
    assert out.status == ERROR and "ValueError" in (out.error or "") and res["status"] == "error"


def test_a_probed_hf_trainer_job_stops_through_its_callback_with_its_model_watched(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out, res = _trial(tmp_path, {"per_device_train_batch_size": 16}, steps=2, trainer=HF_TRAINER)
    assert out.status == FIT and res["steps_run"] == 2, (out, res)  # Trainer.train() stopped after 2 of 50 steps
    assert "trainer returned" in (tmp_path / "probe" / "trial.log").read_text()  # and the script went on, cleanly
    model = res["model"]  # handed over by GlueCallback.on_train_begin: the model and the (unwrapped) optimizer
    assert model["parameters"] > 100_000 and model["optimizer_state_mb"] == pytest.approx(2 * model["weights_mb"],
                                                                                          rel=0.01)
    assert sum(res["breakdown"]["at_peak_mb"].values()) == pytest.approx(res["breakdown"]["peak_mb"], abs=0.01)


def test_probe_steps_must_be_a_whole_number(tmp_path: Path) -> None:
    from glue.train.run.probe import Probe

    with pytest.raises(ValueError, match=V.PROBE_STEPS):
        Probe.from_env({V.PROBE_DIR: str(tmp_path), V.PROBE_STEPS: "two"})
    assert Probe.from_env({}) is None


def test_a_jobs_config_remedies_and_reproducer() -> None:
    cfg = source.job_config({"batch_size": 64, "lr": 0.1, "flag": True}, {}, ["batch_size"], "run r")
    assert cfg["batch_size"] == 64
    with pytest.raises(GlueError, match="config has no 'depth'; vary one of its keys: batch_size, flag, lr"):
        source.job_config(cfg, {}, ["depth"], "run r")
    with pytest.raises(GlueError, match="not a whole number"):
        source.job_config(cfg, {}, ["lr"], "run r")
    manifest = {"config": {"command": ["python", "train.py"], "config": {}}}
    with pytest.raises(GlueError, match="has no `config:`"):
        source.from_manifest("r", Manifest.from_dict(manifest), [])
    job = source.from_manifest("r", Manifest.from_dict({"config": {"command": ["python", "train.py"],
                                                                   "config": {"batch_size": 8}}}), [])
    assert job.job and job.trainer_cfg == {"batch_size": 8}
    [r] = remedies.declared({"grad_accum": {"grad_accum": 8}}, {"grad_accum": 1})
    assert r.change == {"grad_accum": 8} and r.skipped is None
    assert remedies.declared({"x": {"grad_accum": 1}}, {"grad_accum": 1})[0].skipped
    hf = remedies.implied({"per_device_train_batch_size": 64, "gradient_accumulation_steps": 2}, accum=4)
    assert hf == {"gradient_checkpointing": {"gradient_checkpointing": True}, "bf16": {"bf16": True},
                  "grad_accum": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 8}}
    pl = remedies.implied({"batch_size": 6, "accumulate_grad_batches": 1, "precision": "32-true"}, accum=4)
    assert pl == {"grad_accum": {"batch_size": 2, "accumulate_grad_batches": 3}, "bf16": {"precision": "bf16-mixed"}}
    assert remedies.implied({"batch_size": 8}) == {}  # a plain job: only what it declares
    report = {"searches": [{"vary": "batch_size", "smallest_fail": 128}],
              "model": {"weights_mb": 100.0, "expected_gradients_mb": 100.0, "optimizer_state_mb": 200.0}}
    rp = investigate.reproducer(report, investigate.Options(run="r", memory_limit_mb=300))
    assert rp is not None and rp["fixed_exceeds_limit"] is True and rp["at"] == {"batch_size": 128}
    assert rp["command"] == "glue memprobe --run r --vary batch_size --range 128:128 --no-breakdown --no-remedies"


def test_the_trial_runner_runs_on_the_vm_without_torch_on_import() -> None:
    # vm_trial is started by SSH for every trial: importing it must not cost a torch import
    code = "import sys, glue.memprobe.vm_trial; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

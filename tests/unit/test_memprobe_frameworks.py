"""memprobe on framework jobs, with the trials run HERE: the job's command is started by the same program a VM
runs for each trial (`python -m glue.memprobe.vm_trial SPEC`, under a real memory cgroup), only the SSH hop is
left out (tests/e2e/test_memprobe_own_job.py covers it on a VM).

- An HF Trainer job with no `memprobe:` config: memprobe varies its per_device_train_batch_size (its TrainingArguments
  from the run's `config:`), stops each trial through GlueCallback after K steps, and tries gradient checkpointing
  as a remedy at the failing input, judged by the run's acceptance criteria on the evaluation the trial recorded.
- A Lightning job stops itself after K whole steps through its GlueCallback, fit() returning to the user's script;
  with accumulate_grad_batches (its implied grad_accum remedy) K optimizer steps, with the whole batch's loss.
- A first trial that fails for another reason than memory: one line, nothing written outside the probe folder.
Tiny models built from configs: nothing is downloaded."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from glue.errors import GlueError
from glue.memprobe import investigate, job, output
from glue.memprobe import remedies as rem
from glue.memprobe.limits import TrialLimit
from glue.memprobe.runner import FIT, OOM, TrialOutcome
from glue.runs import memprobe_hint
from glue.train.run.launch import TrainerEnv

HF_TRAINER = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from glue.train import RunContext
from glue.train.integrations.hf import GlueCallback
from glue.train.run.evaluation import record_evaluation


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, seed):
        self.x = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


with RunContext.from_env() as ctx:
    cfg = ctx.config  # the run's TrainingArguments
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=256, n_embd=64, n_layer=6, n_head=4,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(ctx.scratch / "hf"), max_steps=50, logging_steps=1, report_to=[],
                             use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3,
                             per_device_train_batch_size=int(cfg["per_device_train_batch_size"]),
                             per_device_eval_batch_size=4,
                             gradient_accumulation_steps=int(cfg.get("gradient_accumulation_steps", 1)),
                             gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)),
                             bf16=bool(cfg.get("bf16", False)))
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4096, 256, 0), eval_dataset=Tokens(8, 256, 1),
                      callbacks=[GlueCallback(ctx)])
    trainer.train()
    metrics = trainer.evaluate()
    record_evaluation(ctx, trainer.state.global_step, {"eval_loss": metrics["eval_loss"]}, final=True)
'''

LIGHTNING_TRAINER = '''
import warnings

import pytorch_lightning as pl
import torch

from glue.train import RunContext
from glue.train.integrations.lightning import GlueCallback

warnings.filterwarnings("ignore")


class Regressor(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        torch.manual_seed(0)
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


with RunContext.from_env() as ctx:
    cfg = ctx.config
    torch.set_num_threads(1)
    model = Regressor(float(cfg["lr"]))
    x = torch.randn(4096, 256, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]),
                                         batch_size=int(cfg["batch_size"]))
    trainer = pl.Trainer(max_steps=50, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accumulate_grad_batches=int(cfg.get("accumulate_grad_batches", 1)),
                         callbacks=[GlueCallback(ctx)])
    trainer.fit(model, loader)
    print(f"fit returned at step {trainer.global_step}", flush=True)
'''


@dataclass
class LocalJob(job.JobTrials):
    """The job's trials on this machine: vm_trial started here instead of over SSH on a VM."""

    folder: Path = Path()

    @property
    def probe_dir(self) -> str:
        return str(self.folder / "trial")

    def run_spec(self, spec: dict[str, Any], timeout_s: float) -> tuple[str, str, int]:
        path = self.folder / job.SPEC_NAME
        path.write_text(__import__("json").dumps(spec))
        res = subprocess.run([sys.executable, "-m", "glue.memprobe.vm_trial", str(path)], capture_output=True,
                             text=True, timeout=timeout_s)
        return res.stdout, res.stderr, res.returncode

    @property
    def log(self) -> str:
        return (self.folder / "trial" / "trial.log").read_text()


def local_job(tmp_path: Path, trainer: str, cfg: dict[str, Any]) -> LocalJob:
    script = tmp_path / "train.py"
    script.write_text(trainer)
    base = TrainerEnv(run="fw-job", attempt=job.PROBE_ATTEMPT, config=cfg, checkpoint=str(tmp_path / "ckpt"),
                      outputs=str(tmp_path / "out"), bucket_name="no-such-bucket", scratch=str(tmp_path / "scratch"))
    env = {**base.to_env(), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    return LocalJob(home=tmp_path, store=None, rc=None, host=SimpleNamespace(name="this machine"),  # type: ignore[arg-type]
                    argv=[sys.executable, str(script)], env=env, cwd=str(tmp_path), base=base, folder=tmp_path)


def test_an_hf_trainer_job_is_probed_by_its_batch_size_and_gradient_checkpointing_without_memprobe_config(
        tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    probe = TrialLimit(64)
    cgroup = probe.path is not None
    probe.remove()
    if not cgroup:
        pytest.skip("needs a writable memory cgroup (root): the trials' limit")
    cfg = {"per_device_train_batch_size": 32}  # an HF Trainer job's TrainingArguments, no memprobe: config
    vary = memprobe_hint.default_vary(cfg)
    assert vary == "per_device_train_batch_size"
    assert memprobe_hint.command("fw-job", {"command": ["python", "train.py"], "config": cfg}) == \
        "glue memprobe --run fw-job --vary per_device_train_batch_size"
    # Measured here (peak RSS): batch 16 ~990 MB, 32 ~1480 MB, 32 with gradient checkpointing ~880 MB.
    opts = investigate.Options(
        vary=[vary], ranges={vary: (16, 32)}, grid="pow2", memory_limit_mb=1200, trial_steps=2, accept_steps=3,
        remedies=("gradient_checkpointing",), breakdown=False, trial_timeout_s=300, run="fw-job",
        job=local_job(tmp_path, HF_TRAINER, cfg), acceptance={"eval_loss": {"min": None, "max": 10.0}})
    report = investigate.run(cfg, opts)

    [s] = report["searches"]
    assert (s["largest_fit"], s["smallest_fail"]) == (16, 32) and s["trial_count"] <= s["trial_bound"], s
    assert all(t["steps_run"] == 2 for t in s["trials"] if t["status"] == FIT)  # stopped by GlueCallback
    rm = report["remedies"]
    assert rm["at"] == {vary: 32} and rm["baseline"]["status"] == OOM
    [gc] = rm["items"]  # implied by the TrainingArguments, not declared
    assert gc["name"] == "gradient_checkpointing" and gc["change"] == {"gradient_checkpointing": True}
    assert gc["status"] == FIT and gc["steps_run"] == 3, gc
    assert gc["evaluation"]["metrics"]["eval_loss"] < 10.0 and gc["accepted"] is True
    assert gc["judged_by"].startswith("the run's acceptance criteria") and rm["works"] == ["gradient_checkpointing"]
    assert "eval_loss ≤ 10" in rm["acceptance"]
    assert report["reproducer"]["command"] == (f"glue memprobe --run fw-job --vary {vary} --range 32:32 "
                                               "--no-breakdown --no-remedies")
    assert not [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]  # nothing saved by a trial
    console = Console(record=True, width=200)
    output.print_report(console, report)
    assert "judged by the run's acceptance criteria, on its evaluation at step 3: eval_loss" in console.export_text()
    # The same row under criteria the model cannot meet fails them; a run without criteria: the loss check.
    strict = {k: v for k, v in gc.items() if k not in ("accepted", "judged_by")}
    rem.judge(strict, rm["reference"]["loss"], 0.05, {"eval_loss": {"min": None, "max": 0.01}})
    assert strict["accepted"] is False and strict["acceptance"][0]["passed"] is False
    rem.judge(strict, rm["reference"]["loss"], 0.05, {})
    assert strict["accepted"] is True and strict["judged_by"] == "the loss check"


def test_a_lightning_job_stops_itself_after_k_steps_through_its_callback(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    cfg = {"batch_size": 512, "lr": 0.01, "accumulate_grad_batches": 1}
    lj = local_job(tmp_path, LIGHTNING_TRAINER, cfg)
    out: TrialOutcome = lj.trial(cfg, {"batch_size": 512}, steps=3, limit_mb=None, timeout_s=300)
    assert out.status == FIT and out.exit == 0 and out.steps_run == 3, (out, lj.log)
    assert "fit returned at step 3" in lj.log  # fit() stopped after 3 of 50 steps; the user's script went on
    model = out.detail["model"]  # handed over by GlueCallback.on_train_start: the module and its optimizer
    assert model["parameters"] == 256 * 64 + 64 + 64 + 1
    assert model["optimizer_state_mb"] == pytest.approx(2 * model["weights_mb"], rel=0.01)
    b = out.detail["breakdown"]
    assert sum(b["at_peak_mb"].values()) == pytest.approx(b["peak_mb"], abs=0.01)
    # The grad_accum remedy a Lightning job gets without declaring it: K whole (optimizer) steps of 4
    # micro-batches each, and the step's loss is the whole batch's: the same data, the same loss.
    accum = rem.implied(cfg, 4)["grad_accum"]
    assert accum == {"batch_size": 128, "accumulate_grad_batches": 4}
    split = lj.trial({**cfg, **accum}, accum, steps=3, limit_mb=None, timeout_s=300)
    assert split.status == FIT and split.steps_run == 3 and "fit returned at step 3" in lj.log, (split, lj.log)
    assert split.loss_last == pytest.approx(out.loss_last, rel=1e-4)


def test_a_first_trial_failing_for_another_reason_than_memory_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    cfg = {"batch_size": 64, "lr": "oops"}
    opts = investigate.Options(vary=["batch_size"], ranges={"batch_size": (32, 64)}, grid="pow2", trial_steps=2,
                               remedies=(), breakdown=False, trial_timeout_s=300, run="fw-job",
                               job=local_job(tmp_path, LIGHTNING_TRAINER, cfg))
    with pytest.raises(GlueError) as err:
        investigate.run(cfg, opts)
    line = str(err.value)
    assert "\n" not in line and line.startswith("the first trial failed before any memory question could be asked")
    assert "ValueError" in line and "oops" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "trial"]  # the trial's spec removed once read


def test_the_oom_next_step_names_a_memprobe_command_that_works_for_the_run() -> None:
    def cmd(**run_config: Any) -> str:
        return memprobe_hint.command("r", {"command": ["python", "train.py"], **run_config})

    tiny = {"command": ["python", "-m", "glue.examples.tiny_gpt"]}
    assert memprobe_hint.command("r", tiny) == "glue memprobe --run r"
    assert cmd(config={"batch_size": 64, "lr": 0.1}) == "glue memprobe --run r --vary batch_size"
    assert cmd(config={"per_device_train_batch_size": 8}) == "glue memprobe --run r --vary per_device_train_batch_size"
    assert cmd(config={"micro_batch_size": 2, "seq_len": 4096}) == "glue memprobe --run r --vary micro_batch_size"
    # no batch size by a known name: the whole-number keys to choose from; none, or another runtime: why not
    assert cmd(config={"features": 2048, "steps": 40, "lr": 0.1}) == \
        "glue memprobe --run r --vary KEY (KEY: the one of features, steps that sizes a step)"
    assert "has none: give the trainer its batch size through `config:`" in cmd(config={})
    assert "`runtime: process` runs only" in cmd(runtime="docker", config={"batch_size": 8})
    assert memprobe_hint.next_step("r", {"command": ["python", "t.py"], "config": {"batch_size": 8}}) == \
        "no blind restart: it repeats at this input; investigate with `glue memprobe --run r --vary batch_size`"
    assert memprobe_hint.default_vary({"lr": 0.1}) is None  # memprobe then refuses, naming the keys it has

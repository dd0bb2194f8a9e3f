"""Hugging Face Trainer through glue.train.integrations.hf: its checkpoint folders sealed into the target,
a new machine (empty output_dir) resumes from the newest valid one (a torn newer one skipped with an
incident) and continues with per-step losses bitwise equal to the uninterrupted run (CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.train import layout
from tests.integration.test_ckpt_toy import json_result, run_context_env

STEPS, EVERY = 12, 4


def _train(target: str, output_dir: str, resume: bool, out: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from glue.train.integrations.hf import GlueCallback, resume_checkpoint

    class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.x = torch.randint(0, 64, (96, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    torch.manual_seed(0)  # a random-weight model from a config: nothing downloaded
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=8, save_steps=EVERY,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    callback = GlueCallback(target=target)
    start = resume_checkpoint(callback, output_dir) if resume else None
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train(resume_from_checkpoint=start)
    Path(out).write_text(json.dumps({"losses": callback.losses, "start": start}))


def _run(target: Path, output_dir: Path, out: Path, resume: bool) -> dict[str, Any]:
    return json_result(_train, str(target), str(output_dir), resume, out=out)


@pytest.mark.timeout(600)
def test_a_new_machine_resumes_the_trainer_from_the_newest_valid_sealed_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "bucket"
    ref = _run(target, tmp_path / "vm1", tmp_path / "ref.json", resume=False)
    assert sorted(ref["losses"]) == list(range(1, STEPS + 1))
    steps = sorted(int(p.name.removeprefix("step-")) for p in (target / layout.CKPT_PREFIX).iterdir())
    assert steps == [8, 12]  # keep_last=2: step 4 pruned after 12 committed
    commit = json.loads((target / layout.commit_key(8)).read_text())
    local = tmp_path / "vm1" / "checkpoint-8"
    files = {o["key"]: o for o in commit["components"]["files"]}
    assert {k.removeprefix("files/") for k in files if k.startswith("files/")} == \
        {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    for key, o in files.items():
        assert (target / "ckpt" / "step-8" / key).stat().st_size == o["size"]

    # The newest one is torn (a file cut short): skipped with an incident, the resume starts from step 8.
    torn = target / "ckpt" / "step-12" / "files" / "model.safetensors"
    torn.write_bytes(torn.read_bytes()[:100])
    again = _run(target, tmp_path / "vm2", tmp_path / "again.json", resume=True)
    assert again["start"] == str(tmp_path / "vm2" / "checkpoint-8")
    assert again["losses"] == {s: ref["losses"][s] for s in range(9, STEPS + 1)}
    incidents = [json.loads(p.read_text()) for p in (target / "incidents").iterdir()]
    assert [(i["class"], i["step"], i["fell_back_to"]) for i in incidents] == [("ckpt_corrupt", 12, 8)]
    assert "files/model.safetensors" in incidents[0]["object"]


def test_an_unsupported_transformers_version_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from glue.train.errors import CheckpointError
    from glue.train.integrations import hf

    monkeypatch.setattr(transformers, "__version__", "4.20.1")
    with pytest.raises(CheckpointError, match=r"^transformers 4.20.1 is not supported by gpukit's integration: "
                                              r"use 4.46 or newer$"):
        hf._trainer_callback()


NOTICE_TRAINER = """
import os, signal, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from glue.train import RunContext
from glue.train.integrations.hf import GlueCallback

class Tokens(torch.utils.data.Dataset):
    def __len__(self): return 96
    def __getitem__(self, i):
        x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}

class Terminate(TrainerCallback):  # the VM's notice: SIGTERM to the trainer, at the end of step 5
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

with RunContext.from_env() as ctx:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=sys.argv[1], max_steps=50, per_device_train_batch_size=8, save_steps=20,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Terminate(), GlueCallback(ctx)]).train()
"""


@pytest.mark.timeout(300)
def test_a_termination_notice_makes_the_trainer_save_seal_and_exit_preempted(local_bucket: Any,
                                                                            tmp_path: Path) -> None:
    import subprocess
    import sys
    import uuid

    run, name = f"hf-notice-{uuid.uuid4().hex[:8]}", local_bucket.info.name
    env = run_context_env(local_bucket, run, tmp_path, GPUKIT_NOTICE_FILE=str(tmp_path / "no-notice-file"))
    s3 = local_bucket.client()
    s3.put_object(Bucket=name, Key=layout.run_prefix(run) + layout.attempt_key(1), Body=b'{"attempt": 1}')
    proc = subprocess.run([sys.executable, "-c", NOTICE_TRAINER, str(tmp_path / "out")], env=env, text=True,
                          capture_output=True, timeout=240)
    assert proc.returncode == 75, proc.stderr[-3000:]  # PREEMPTED_EXIT: classed `preempted`
    notice = json.loads(s3.get_object(Bucket=name, Key=layout.run_prefix(run) + layout.notice_key(1, 0))["Body"].read())
    assert notice["source"] == "SIGTERM" and notice["step"] == 5 and notice["saved_step"] == 5, notice
    commit = json.loads(s3.get_object(Bucket=name, Key=layout.run_prefix(run) + layout.commit_key(5))["Body"].read())
    assert "files/trainer_state.json" in {o["key"] for o in commit["components"]["files"]}

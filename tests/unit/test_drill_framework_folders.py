"""The drill's final check over the checkpoints the frameworks really write, without a VM: a Hugging Face
Trainer's checkpoint-<N>/ and a Lightning .ckpt of a run resumed from an earlier checkpoint compare equal
to an uninterrupted run's (times and paths left out, the Trainer's arguments named as not compared), and
a changed learning rate is named by file and key. The e2e drills of both examples are
tests/e2e/test_drill_frameworks.py (make test-all)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.operations.recovery.checkpoint_diff import Comparison, compare
from glue.train.checkpoint.format import Commit, ObjectRef


def _sealed(root: Path) -> tuple[Commit, Callable[[str], bytes | None]]:
    """A folder (or one file) as FolderCheckpoints seals it: every file under `files/`."""
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    blobs = {"files/" + (p.name if root.is_file() else p.relative_to(root).as_posix()): p.read_bytes() for p in paths}
    refs = [ObjectRef(k, len(v), hashlib.sha256(v).hexdigest()) for k, v in blobs.items()]
    return Commit(4, "", 1, {"files": refs}), blobs.get


def _compare(a: Path, b: Path) -> Comparison:
    (ca, ra), (cb, rb) = _sealed(a), _sealed(b)
    return compare((ca, cb), (ra, rb))


def _hf(out: Path, resume: Path | None = None, lr: float = 1e-3) -> None:
    transformers = pytest.importorskip("transformers")

    class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.x = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32,
                                                                 n_layer=1, n_head=2))
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=4, per_device_train_batch_size=4,
                                          save_steps=2, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                                          disable_tqdm=True, learning_rate=lr)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens()).train(
        resume_from_checkpoint=str(resume) if resume else None)


def test_a_resumed_trainer_checkpoint_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    _hf(tmp_path / "ref")
    _hf(tmp_path / "drill")
    shutil.rmtree(tmp_path / "drill" / "checkpoint-4")  # the VM lost after step 2's checkpoint
    _hf(tmp_path / "drill", resume=tmp_path / "drill" / "checkpoint-2")
    res = _compare(tmp_path / "ref" / "checkpoint-4", tmp_path / "drill" / "checkpoint-4")
    assert res.differences == [] and res.uncomparable == [], res
    assert res.objects >= 6 and res.tensors > 20, res.summary()
    assert res.skipped and res.skipped[0].startswith("files/training_args.bin"), res.skipped
    _hf(tmp_path / "other", lr=2e-3)
    other = _compare(tmp_path / "ref" / "checkpoint-4", tmp_path / "other" / "checkpoint-4")
    wheres = [d.where for d in other.differences]
    assert wheres[0].startswith("files/model.safetensors:"), wheres
    assert "files/optimizer.pt:param_groups[0].initial_lr" in wheres, wheres


def _lightning(folder: Path, resume: Path | None = None) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    from glue.train.integrations.lightning import GlueCallback

    class Regressor(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))
    pl.seed_everything(0)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True,
                         callbacks=[GlueCallback(None), ModelCheckpoint(dirpath=folder, every_n_train_steps=2,
                                                                        save_top_k=-1)])
    trainer.fit(Regressor(), loader, ckpt_path=str(resume) if resume else None)


def test_a_resumed_lightning_ckpt_equals_the_uninterrupted_one_paths_aside(tmp_path: Path) -> None:
    _lightning(tmp_path / "ref")
    _lightning(tmp_path / "drill")
    (tmp_path / "drill" / "epoch=0-step=4.ckpt").unlink()
    _lightning(tmp_path / "drill", resume=tmp_path / "drill" / "epoch=0-step=2.ckpt")
    # The two runs wrote into different folders: ModelCheckpoint's dirpath and best_model_path differ.
    res = _compare(tmp_path / "ref" / "epoch=0-step=4.ckpt", tmp_path / "drill" / "epoch=0-step=4.ckpt")
    assert res.differences == [] and res.uncomparable == [] and res.objects == 1, res
    assert res.tensors > 10, res.summary()  # weights, AdamW's moments, the sampler's and gpukit's RNG states

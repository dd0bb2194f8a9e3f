"""Lightning through glue.train.integrations.lightning: each .ckpt sealed into the target; a new machine
(empty checkpoint folder) resumes from the newest valid one (a torn newer one skipped with an incident),
with the random streams restored by GlueCallback: per-step losses (dropout on) bitwise equal to the
uninterrupted run on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from glue.train import layout
from tests.integration.test_ckpt_toy import json_result

STEPS, EVERY = 12, 4


def _train(target: str, dirpath: str, resume: bool, out: str) -> None:
    import warnings

    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    from glue.train.integrations.lightning import GlueCallback, GlueCheckpointIO, resume_checkpoint

    warnings.filterwarnings("ignore")

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                           torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 8, generator=g)
    loader = StatefulDataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8,
                                shuffle=True, generator=torch.Generator().manual_seed(2))
    pl.seed_everything(0)
    io, callback = GlueCheckpointIO(target=target), GlueCallback()
    start = resume_checkpoint(io, dirpath) if resume else None
    every = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=EVERY, save_top_k=-1)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True, plugins=[io], callbacks=[callback, every])
    trainer.fit(Regressor(), loader, ckpt_path=start)
    Path(out).write_text(json.dumps({"losses": callback.losses, "start": start}))


def _run(target: Path, dirpath: Path, out: Path, resume: bool) -> dict[str, Any]:
    return json_result(_train, str(target), str(dirpath), resume, out=out)


@pytest.mark.timeout(600)
def test_a_new_machine_resumes_lightning_exactly_from_the_newest_valid_sealed_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "bucket"
    ref = _run(target, tmp_path / "vm1", tmp_path / "ref.json", resume=False)
    assert sorted(ref["losses"]) == list(range(1, STEPS + 1))
    assert sorted(int(p.name.removeprefix("step-")) for p in (target / layout.CKPT_PREFIX).iterdir()) == [8, 12]
    commit = json.loads((target / layout.commit_key(8)).read_text())
    [ckpt] = [o for o in commit["components"]["files"] if o["key"].startswith("files/")]
    assert ckpt["key"] == "files/epoch=0-step=8.ckpt"
    assert ckpt["size"] == (tmp_path / "vm1" / "epoch=0-step=8.ckpt").stat().st_size

    torn = target / "ckpt" / "step-12" / "files" / "epoch=0-step=12.ckpt"
    torn.write_bytes(torn.read_bytes()[:-10])
    again = _run(target, tmp_path / "vm2", tmp_path / "again.json", resume=True)
    assert again["start"] == str(tmp_path / "vm2" / "epoch=0-step=8.ckpt")
    assert again["losses"] == {s: ref["losses"][s] for s in range(9, STEPS + 1)}
    [incident] = [json.loads(p.read_text()) for p in (target / "incidents").iterdir()]
    assert (incident["class"], incident["step"], incident["fell_back_to"]) == ("ckpt_corrupt", 12, 8)


def test_an_unsupported_lightning_version_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytorch_lightning

    from glue.train.errors import CheckpointError
    from glue.train.integrations import lightning

    monkeypatch.setattr(pytorch_lightning, "__version__", "1.9.5")
    with pytest.raises(CheckpointError, match=r"^Lightning 1.9.5 is not supported by gpukit's integration: "
                                              r"use 2.1 or newer$"):
        lightning._lightning()

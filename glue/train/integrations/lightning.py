"""Lightning: every checkpoint a Trainer writes becomes a gpukit checkpoint, and a resume is exact.

    from glue.train.integrations.lightning import GlueCallback, GlueCheckpointIO, resume_checkpoint

    io = GlueCheckpointIO(ctx)                         # deployed by glue (RunContext), or GlueCheckpointIO(target=...)
    trainer = Trainer(plugins=[io], callbacks=[ModelCheckpoint(dirpath=d, every_n_train_steps=50, save_top_k=-1),
                                               GlueCallback(ctx)])
    trainer.fit(model, loader, ckpt_path=resume_checkpoint(io, d))

GlueCheckpointIO writes the `.ckpt` as Lightning does, then seals it into the bucket
(glue.train.checkpoint.sealed: size and sha256 in COMMIT.json, written last; keep_last pruning).
resume_checkpoint downloads the newest valid one (torn ones skipped, each with an incident). Lightning
does not save the random streams: GlueCallback adds them to every checkpoint and restores them at the
start of training (dropout masks continue exactly), reports each step's loss to the RunContext, and
turns a termination notice into a save and an exit with PREEMPTED_EXIT. The data position is
Lightning's own: exact mid-epoch with torchdata's StatefulDataLoader, from the epoch's start otherwise.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from glue.train.checkpoint.sealed import FolderCheckpoints
from glue.train.errors import CheckpointError
from glue.train.integrations.versions import require
from glue.train.loop_state import RNGState
from glue.train.run.context import RunContext

log = logging.getLogger("glue.train")
SUPPORTED = (2, 1)
RNG_KEY = "gpukit_rng"  # where GlueCallback keeps the random streams inside Lightning's checkpoint


def _lightning() -> Any:
    pl: Any
    try:
        import pytorch_lightning as pl
    except ImportError:
        try:
            import lightning.pytorch as pl  # type: ignore[no-redef]
        except ImportError as exc:
            raise CheckpointError("the Lightning integration needs Lightning: pip install 'gpukit[lightning]'") from exc
    require("Lightning", pl.__version__, SUPPORTED)
    return pl


def _base(name: str) -> type:
    pl = _lightning()
    return pl.plugins.io.TorchCheckpointIO if name == "io" else pl.Callback


class GlueCheckpointIO(_base("io")):  # type: ignore[misc]
    """Lightning's own file, then sealed into the run's checkpoint target as the step it was taken at."""

    def __init__(self, ctx: RunContext | None = None, *, target: str | None = None, keep_last: int = 2,
                 sealed: FolderCheckpoints | None = None) -> None:
        super().__init__()
        if sealed is None and ctx is None and target is None:
            raise CheckpointError("GlueCheckpointIO needs the run's RunContext or a checkpoint target")
        self.sealed = sealed or (ctx.folder_checkpoints() if ctx is not None
                                 else FolderCheckpoints(str(target), keep_last=keep_last))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        # The file is read now; upload, verify and COMMIT.json run while training goes on.
        self.sealed.seal_async(int(checkpoint["global_step"]), path)

    def teardown(self) -> None:
        self.sealed.flush()  # the last checkpoint is committed before fit() returns (or its failure raised)
        super().teardown()


class GlueCallback(_base("callback")):  # type: ignore[misc]
    """Random streams in every checkpoint and back; per-step losses; a termination notice -> save, exit."""

    def __init__(self, ctx: RunContext | None = None) -> None:
        self.ctx = ctx
        self.losses: dict[int, float] = {}
        self._rng: dict[str, Any] | None = None
        self._stepped = 0  # the last optimizer step seen: with accumulate_grad_batches, batches between steps
        self._micro: list[float] = []  # the losses of the step's micro-batches so far

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[RNG_KEY] = RNGState().state_dict()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._rng = checkpoint.get(RNG_KEY)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._stepped, self._micro = int(trainer.global_step), []
        if self.ctx is not None:  # measured in a memprobe trial
            self.ctx.probe_watch(pl_module, *trainer.optimizers)
        if self._rng is not None:  # after Lightning restored everything else, before the first batch
            RNGState().load_state_dict(self._rng)
            self._rng = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        step = int(trainer.global_step)
        self._micro.append(float(loss))
        if step <= self._stepped:
            return  # a micro-batch of accumulate_grad_batches: no whole step yet (a memprobe trial counts whole steps)
        # Lightning divides each micro-batch's loss by accumulate_grad_batches: their sum is the step's mean loss.
        value = sum(self._micro) if pl_module.automatic_optimization else self._micro[-1]
        self._stepped, self._micro = step, []
        self.losses[step] = value
        if self.ctx is None:
            return
        self.ctx.record_step(step, value)
        if self.ctx.probe_stop_due():
            trainer.should_stop = True  # a memprobe trial ran its steps
        if self.ctx.notice_pending():
            ckpt = next((c for c in trainer.checkpoint_callbacks if getattr(c, "dirpath", None)), None)
            folder = Path(ckpt.dirpath) if ckpt is not None else Path(trainer.default_root_dir)
            trainer.save_checkpoint(str(folder / f"notice-step={step}.ckpt"))  # sealed by GlueCheckpointIO
            io = trainer.strategy.checkpoint_io
            if isinstance(io, GlueCheckpointIO):
                io.sealed.flush()
            self.ctx.exit_after_notice(step, saved=True)


def resume_checkpoint(io: GlueCheckpointIO, dirpath: str | os.PathLike[str]) -> str | None:
    """The newest valid sealed checkpoint, downloaded into dirpath (for `ckpt_path=`); None when there is none."""
    fetched = io.sealed.fetch(Path(dirpath))
    if fetched is None:
        return None
    log.info("resuming from sealed checkpoint step %d (%s)", fetched.step, fetched.path)
    return str(fetched.path)

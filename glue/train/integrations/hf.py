"""Hugging Face `Trainer`: every checkpoint it saves becomes a gpukit checkpoint.

    from glue.train.integrations.hf import GlueCallback, resume_checkpoint

    callback = GlueCallback(ctx)                       # deployed by glue (RunContext), or GlueCallback(target=...)
    trainer = Trainer(..., args=TrainingArguments(..., logging_steps=1), callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume_checkpoint(callback, args.output_dir))

On each save the Trainer's `checkpoint-<N>/` folder is sealed into the bucket (glue.train.checkpoint.sealed:
every file with its size and sha256 in COMMIT.json, written last; keep_last pruning): its files are read
on the training thread, the upload and commit run in the background (the next save waits for it). At the start of an
attempt `resume_checkpoint` downloads the newest valid one (torn ones skipped, each with an incident) into
output_dir: a new VM's empty disk resumes from the bucket. Per-step losses go to the RunContext (so
`glue recover` and `glue drill` can check the resume), and a termination notice makes the Trainer save,
seal and exit PREEMPTED_EXIT.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from glue.train.checkpoint.sealed import FolderCheckpoints
from glue.train.errors import CheckpointError
from glue.train.integrations.versions import require
from glue.train.run.context import RunContext

log = logging.getLogger("glue.train")
SUPPORTED = (4, 46)  # transformers versions from which TrainerCallback and checkpoint-<N> folders behave as used here


def _trainer_callback() -> type:
    try:
        import transformers
    except ImportError as exc:
        raise CheckpointError("the Hugging Face integration needs transformers: pip install 'gpukit[hf]'") from exc
    require("transformers", transformers.__version__, SUPPORTED)
    return transformers.TrainerCallback


class GlueCallback(_trainer_callback()):  # type: ignore[misc]
    """Seals each checkpoint the Trainer saves; reports per-step losses; turns a termination notice into
    a save. Give it the run's RunContext (deployed by glue) or a checkpoint target of your own."""

    def __init__(self, ctx: RunContext | None = None, *, target: str | None = None, keep_last: int = 2,
                 sealed: FolderCheckpoints | None = None) -> None:
        if sealed is None and ctx is None and target is None:
            raise CheckpointError("GlueCallback needs the run's RunContext or a checkpoint target")
        self.ctx = ctx
        self.sealed = sealed or (ctx.folder_checkpoints() if ctx is not None
                                 else FolderCheckpoints(str(target), keep_last=keep_last))
        self.losses: dict[int, float] = {}
        self._stopping = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ctx is not None and args.logging_steps != 1:
            raise CheckpointError(f"logging_steps is {args.logging_steps}: glue checks a resume step by step, "
                                  "so set TrainingArguments(logging_steps=1)")
        if self.ctx is not None:  # measured in a memprobe trial
            self.ctx.probe_watch(kwargs.get("model"), kwargs.get("optimizer"))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs and "loss" in logs and "train_runtime" not in logs:
            self.losses[state.global_step] = float(logs["loss"])
            if self.ctx is not None:
                self.ctx.record_step(state.global_step, float(logs["loss"]))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ctx is not None and self.ctx.probe_stop_due(state.global_step):
            control.should_training_stop = True  # a memprobe trial ran its steps
        if self.ctx is not None and self.ctx.notice_pending():
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero:
            # The files are read now; upload, verify and COMMIT.json run while training goes on.
            self.sealed.seal_async(state.global_step, folder)
        if self._stopping and self.ctx is not None:
            self.sealed.flush()
            self.ctx.exit_after_notice(state.global_step, saved=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.sealed.flush()  # the last checkpoint is committed before the run ends (or its failure raised)


def resume_checkpoint(callback: GlueCallback, output_dir: str | Path) -> str | None:
    """The newest valid sealed checkpoint, downloaded into output_dir (for `resume_from_checkpoint=`);
    None when the run has none yet."""
    fetched = callback.sealed.fetch(Path(output_dir))
    if fetched is None:
        return None
    log.info("resuming from sealed checkpoint step %d (%s)", fetched.step, fetched.path)
    return str(fetched.path)

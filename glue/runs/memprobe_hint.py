"""The `glue memprobe` command that works for one run, from its run config: what the OOM incident's `next:`,
`glue status --run X` and the README name. `glue memprobe` takes its default input to vary from here too,
so the command named and the command run agree.

- a run of glue.examples.tiny_gpt: `glue memprobe --run X` (memprobe's own worker; batch_size by default);
- any other `runtime: process` run: `glue memprobe --run X --vary KEY`, KEY its batch size by the usual names
  (batch_size, per_device_train_batch_size for an HF Trainer job, micro_batch_size); with none of those, the
  command with `--vary KEY` and the whole-number keys of its `config:` to choose from;
- a run memprobe cannot probe (another runtime, no whole-number `config:` value): why, and what to change.
"""

from __future__ import annotations

from typing import Any

TINY_GPT = "glue.examples.tiny_gpt"
# What a run's own job is probed by when --vary is not given: its batch size, by the usual names.
DEFAULT_VARY = ("batch_size", "per_device_train_batch_size", "micro_batch_size")
OOM_CLASSES = ("oom_gpu", "oom_host")


def is_tiny_gpt(command: Any) -> bool:
    argv = command.split() if isinstance(command, str) else list(command or [])
    return any(str(a) == TINY_GPT or str(a).endswith("tiny_gpt.py") for a in argv)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def default_vary(cfg: dict[str, Any]) -> str | None:
    """The config key memprobe varies when --vary is not given: the batch size by its usual names (present, even
    if not a whole number: memprobe then says so); None when the config has none of them."""
    return next((k for k in DEFAULT_VARY if k in cfg), None)


def command(run: str, run_config: dict[str, Any]) -> str:
    """The memprobe command for `run` (its manifest's run config), or, when memprobe cannot probe it, what to do."""
    if is_tiny_gpt(run_config.get("command")):
        return f"glue memprobe --run {run}"
    runtime = run_config.get("runtime") or "process"
    if runtime != "process":
        return (f"`glue memprobe` runs trials of `runtime: process` runs only, and run {run} is `runtime: {runtime}` "
                "(docs/memprobe.md)")
    cfg = run_config.get("config") or {}
    key = default_vary(cfg)
    if key is not None and _whole(cfg[key]):
        return f"glue memprobe --run {run} --vary {key}"
    sizes = sorted(k for k, v in cfg.items() if _whole(v))
    if not sizes:
        return (f"`glue memprobe` changes one whole-number value of the run's `config:` per trial and run {run}'s has "
                "none: give the trainer its batch size through `config:` (ctx.config) and deploy again")
    return f"glue memprobe --run {run} --vary KEY (KEY: the one of {', '.join(sizes)} that sizes a step)"


def next_step(run: str, run_config: dict[str, Any]) -> str:
    """`glue status`'s next step for a run that ran out of memory."""
    cmd = command(run, run_config)
    how = f"`{cmd}`" if cmd.startswith("glue memprobe") else cmd
    return f"no blind restart: it repeats at this input; investigate with {how}"

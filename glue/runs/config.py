"""The run config (run.yaml): parsed, validated, unknown keys rejected by name.

```yaml
command: [python, -m, glue.examples.tiny_gpt]   # or image: for the docker runtime
runtime: process                                # process | docker
config: {steps: 200, batch_size: 16}            # handed to the trainer (GPUKIT_CONFIG)
input: {uri: builtin://tiny-corpus, version: v1}
outputs: {destination: "s3://gpukit/runs/{run}/outputs", required: [model.pt]}
checkpoint: {target: "s3://gpukit/runs/{run}", interval_steps: 20, keep_last: 2}
env: {OMP_NUM_THREADS: "1"}
secrets: [WANDB_API_KEY]                        # names only; values come from the environment
monitor: {heartbeat_seconds: 2, stall_timeout_seconds: 60}
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from glue.errors import GlueError

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SECRET_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class InputSpec:
    uri: str
    version: str


@dataclass(frozen=True)
class OutputsSpec:
    destination: str
    required: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointSpec:
    target: str
    interval_steps: int
    keep_last: int


@dataclass(frozen=True)
class MonitorSpec:
    heartbeat_seconds: float = 2.0
    stall_timeout_seconds: float = 60.0


@dataclass(frozen=True)
class RunConfig:
    command: tuple[str, ...]
    image: str | None
    runtime: str
    config: dict[str, Any]
    input: InputSpec | None
    outputs: OutputsSpec
    checkpoint: CheckpointSpec
    env: dict[str, str]
    secrets: tuple[str, ...]
    monitor: MonitorSpec = field(default_factory=MonitorSpec)

    def locations(self) -> dict[str, str]:
        """Every place the run writes durable data: each must be in the bucket."""
        return {"checkpoint.target": self.checkpoint.target, "outputs.destination": self.outputs.destination}

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": list(self.command), "image": self.image, "runtime": self.runtime, "config": self.config,
            "input": self.input.__dict__ if self.input else None,
            "outputs": {"destination": self.outputs.destination, "required": list(self.outputs.required)},
            "checkpoint": self.checkpoint.__dict__, "env": self.env, "secrets": list(self.secrets),
            "monitor": self.monitor.__dict__,
        }


def _keys(where: str, raw: Any, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if not isinstance(raw, dict):
        raise GlueError(f"{where} must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise GlueError(f"unknown key {unknown[0]!r} in {where}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(raw))
    if missing:
        raise GlueError(f"missing key {missing[0]!r} in {where}")
    return raw


def _str(where: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise GlueError(f"{where} must be a non-empty string")
    return v


def _int(where: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise GlueError(f"{where} must be an integer >= {lo}")
    return v


def parse(raw: Any, run_id: str, bucket: str) -> RunConfig:
    """Validate a loaded run.yaml; `{run}` and `{bucket}` in locations are substituted."""
    top = _keys("run config", raw, {"command", "image", "runtime", "config", "input", "outputs", "checkpoint",
                                    "env", "secrets", "monitor"}, {"outputs", "checkpoint"})
    runtime = top.get("runtime", "process")
    if runtime not in ("process", "docker"):
        raise GlueError(f"runtime must be 'process' or 'docker', got {runtime!r}")
    command = top.get("command")
    if isinstance(command, str):
        command = command.split()
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(c, str | int | float) for c in command)):
        raise GlueError("command must be a list of strings (or one string)")
    image = top.get("image")
    if image is not None:
        image = _str("image", image)
    if not command and not image:
        raise GlueError("missing command: set `command:` (process runtime) or `image:` (docker runtime)")
    if runtime == "docker" and not image:
        raise GlueError("runtime docker needs `image:` (build it from images/trainer/Dockerfile)")

    def subst(s: str) -> str:
        return s.replace("{run}", run_id).replace("{bucket}", bucket)

    out = _keys("outputs", top["outputs"], {"destination", "required"}, {"destination"})
    req = out.get("required", [])
    if not isinstance(req, list) or not all(isinstance(r, str) and r for r in req):
        raise GlueError("outputs.required must be a list of file names")
    ck = _keys("checkpoint", top["checkpoint"], {"target", "interval_steps", "keep_last"}, {"target"})
    inp = top.get("input")
    input_spec = None
    if inp is not None:
        inp = _keys("input", inp, {"uri", "version"}, {"uri", "version"})
        input_spec = InputSpec(_str("input.uri", inp["uri"]), str(inp["version"]))
    cfg = top.get("config", {})
    if not isinstance(cfg, dict):
        raise GlueError("config must be a mapping of trainer settings")
    env = top.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise GlueError("env must be a mapping of NAME: value")
    secrets = top.get("secrets", [])
    if not isinstance(secrets, list) or not all(isinstance(s, str) and SECRET_NAME_RE.match(s) for s in secrets):
        raise GlueError("secrets must be a list of environment variable NAMES (values never go in run.yaml)")
    mon = _keys("monitor", top.get("monitor", {}), {"heartbeat_seconds", "stall_timeout_seconds"})
    return RunConfig(
        command=tuple(str(c) for c in command or ()),
        image=image,
        runtime=runtime,
        config=dict(cfg),
        input=input_spec,
        outputs=OutputsSpec(subst(_str("outputs.destination", out["destination"])).rstrip("/"), tuple(req)),
        checkpoint=CheckpointSpec(
            target=subst(_str("checkpoint.target", ck["target"])).rstrip("/"),
            interval_steps=_int("checkpoint.interval_steps", ck.get("interval_steps", 50), 1),
            keep_last=_int("checkpoint.keep_last", ck.get("keep_last", 2), 2),
        ),
        env={k: str(v) for k, v in env.items()},
        secrets=tuple(secrets),
        monitor=MonitorSpec(
            heartbeat_seconds=float(mon.get("heartbeat_seconds", 2.0)),
            stall_timeout_seconds=float(mon.get("stall_timeout_seconds", 60.0)),
        ),
    )


def check_run_id(run_id: str) -> None:
    if not RUN_ID_RE.match(run_id):
        raise GlueError(f"invalid run id {run_id!r}: use 1-63 lowercase letters, digits, '.', '_' or '-'")


def load(path: Path, run_id: str, bucket: str) -> RunConfig:
    check_run_id(run_id)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise GlueError(f"cannot read run config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise GlueError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    return parse(raw, run_id, bucket)

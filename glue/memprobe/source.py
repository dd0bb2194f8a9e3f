"""Where the probed configuration comes from: a run.yaml, or a run's manifest in the bucket (plus
what its failed attempt ran under: the memory limit, the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from glue import yamlfile
from glue.errors import GlueError, yaml_problem
from glue.runs import memprobe_hint
from glue.runs.records import AttemptRecord, Manifest
from glue.runs.store import RunStore

TRAINER_MODULE = memprobe_hint.TINY_GPT
MAX_VALUE = 2**31 - 1  # the largest size a trial can be asked for (torch takes sizes as 64-bit, products too)


@dataclass
class Source:
    trainer_cfg: dict[str, Any]                # the run config's `config:` (before the trainer's defaults)
    description: str
    run: str | None = None
    config_path: str | None = None
    memory_limit_mb: int | None = None         # what the failed attempt ran under
    failure: dict[str, Any] = field(default_factory=dict)  # the attempt/incident that sent us here
    manifest: Manifest | None = None     # a run's own job (not tiny_gpt): trials of its command on a VM

    @property
    def job(self) -> bool:
        return self.manifest is not None


is_tiny_gpt = memprobe_hint.is_tiny_gpt


def from_config_file(path: Path) -> Source:
    if path.exists() and not path.is_file():  # a device or a pipe: reading may never end
        raise GlueError(f"{path} is not a regular file; give a run config file (run.yaml)")
    try:
        raw = yamlfile.load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GlueError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise GlueError(f"{path} is not a UTF-8 text YAML file (undecodable byte at offset {exc.start}); "
                        "give a run config (run.yaml)") from exc
    except yaml.YAMLError as exc:
        raise GlueError(f"{path} is not valid YAML{yaml_problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise GlueError(f"{path} must be a run config mapping (command:, config:, ...)")
    from glue.runs import config as runconfig

    # The same validation glue deploy applies; where results go does not matter to a probe.
    raw = {"outputs": {"destination": "s3://gpukit/memprobe"}, "checkpoint": {"target": "s3://gpukit/memprobe"},
           **raw}
    rc = runconfig.parse(raw, "memprobe", "gpukit")
    if is_tiny_gpt(rc.command):
        return Source(trainer_cfg=dict(rc.config), description=str(path), config_path=str(path))
    if not rc.config:
        raise GlueError(f"{path} has no `config:`: memprobe changes one config value per trial (--vary KEY); give "
                        "the trainer its sizes through `config:` (read as ctx.config)")
    # Your own job from its run.yaml: its workdir and requirements are shipped as glue deploy ships them.
    return Source(trainer_cfg=dict(rc.config), description=str(path), config_path=str(path),
                  manifest=Manifest.from_dict({"config": rc.as_dict()}))


def from_manifest(run: str, manifest: Manifest, attempts: list[AttemptRecord]) -> Source:
    run_cfg = manifest.config
    job = not is_tiny_gpt(run_cfg.get("command") or manifest.command)
    if job and not run_cfg.get("config"):
        raise GlueError(f"run {run} has no `config:` in its run config: memprobe changes one config value per "
                        "trial (--vary KEY); give the trainer its sizes through `config:` (read as ctx.config)")
    failed = [a for a in attempts if str(a.failure_class or "").startswith("oom")]
    last = failed[-1] if failed else (attempts[-1] if attempts else None)
    limit = last.memory_limit_mb if last else None
    return Source(trainer_cfg=dict(run_cfg.get("config") or {}), description=f"run {run} (bucket manifest)",
                  run=run, memory_limit_mb=int(limit) if limit else None,
                  failure=_failure(last), manifest=manifest if job else None)


def _failure(last: AttemptRecord | None) -> dict[str, Any]:
    """What memprobe reports of the attempt it probes for: the keys of its record that name the failure."""
    wanted = ("attempt", "vm", "failure_class", "last_step", "incident", "memory_limit_mb")
    return {k: v for k, v in (last.to_dict() if last else {}).items() if k in wanted}


def from_run(home: Path, run: str) -> tuple[Source, Any]:

    store = RunStore.open(home, run)
    manifest = store.read_manifest()
    attempts = [a for a in map(store.read_attempt, store.attempts()) if a is not None]
    return from_manifest(run, manifest, attempts), store


def parse_set(items: tuple[str, ...]) -> dict[str, Any]:
    """--set key=value (YAML scalars: 64, true, 1e-3)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise GlueError(f"--set wants key=value, got {item!r}")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise GlueError(f"--set {item}: {value!r} is not a YAML value ({str(exc).splitlines()[0]}); "
                            "give a number, true/false or text") from exc
    return out


def parse_ranges(items: tuple[str, ...], vary: list[str]) -> dict[str, tuple[int, int]]:
    """--range LO:HI (for the one --vary) or --range NAME=LO:HI."""
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        name, sep, span = item.rpartition("=")
        if not sep:
            if len(vary) != 1:
                raise GlueError(f"--range {item}: with several --vary, name it: --range {vary[0]}={item}")
            name = vary[0]
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", span)
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)) <= MAX_VALUE:
            raise GlueError(f"--range wants LO:HI with 1 <= LO <= HI <= {MAX_VALUE}, got {item!r}")
        if name not in vary:
            raise GlueError(f"--range names {name!r}, which is not varied (--vary {name})")
        if name in out:
            raise GlueError(f"--range {item}: a range for {name} was given twice; give one")
        out[name] = (int(m.group(1)), int(m.group(2)))
    return out


def job_config(source_cfg: dict[str, Any], overrides: dict[str, Any], vary: list[str], where: str) -> dict[str, Any]:
    """A run's own config with --set applied; every varied key must be one of its whole-number sizes."""
    cfg = {**source_cfg, **overrides}
    for key in vary:
        if key not in cfg:
            raise GlueError(f"--vary {key}: {where}'s config has no {key!r}; vary one of its keys: "
                            f"{', '.join(sorted(cfg)) or '(none)'}")
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GlueError(f"--vary {key}: {where}'s {key} is {value!r}, not a whole number of 1 or more; "
                            "vary a size (a batch size, a length, a width)")
    return cfg


def trainer_config(source_cfg: dict[str, Any], overrides: dict[str, Any],
                   where: str = "the run config") -> dict[str, Any]:
    """What tiny_gpt would run with: its DEFAULTS, the run's config (`where`), then --set; checked as
    tiny_gpt checks it (a size of 0 or less, a wrong type: one line naming the key and where it came from)."""
    from glue.examples.tiny_gpt import DEFAULTS, check_config

    cfg = {**DEFAULTS, **source_cfg, **overrides}
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise GlueError(f"--set {unknown[0]}: not a {TRAINER_MODULE} setting; known: {', '.join(sorted(DEFAULTS))}")
    try:
        check_config(cfg)
    except ValueError as exc:
        m = re.search(r"config\.(\w+)|key '(\w+)'", str(exc))
        key = (m.group(1) or m.group(2)) if m else None
        if key is not None and key in overrides:
            raise GlueError(f"--set {key}={_yaml_text(overrides[key])}: {exc}") from exc
        fix = f" (fix it there, or override it with --set {key}=VALUE)" if key in DEFAULTS else ""
        raise GlueError(f"{where}: {exc}{fix}") from exc
    return cfg


def _yaml_text(value: Any) -> str:
    return str(yaml.safe_dump(value, default_flow_style=True)).removesuffix("\n...\n").strip()

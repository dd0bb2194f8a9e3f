"""Each idle spare holds warm trainer processes (glue.train.run.warm) and the live runs' environments,
waiting for the attempt a recovery starts on the spare.

arm      after `glue up`, after a refill converged the pool, and after `glue deploy` of a run with its own
         requirements: on each idle spare (glue.train.spare.arm, over SSH) the trainer venv's warm process
         runs, each live run's environment (its dependency set, from the set's pack) is ready with a warm
         process of its own, and every warm process follows the live runs of its environment, loading the
         modules they recorded (glue.train.run.warm_imports). A spare taken by a recovery has the process
         of the attempt's environment consumed by the attempt (it becomes that attempt's supervisor) and
         the others ended; the refill's new spare is armed in turn. A spare that could not be armed still
         serves: its attempt starts cold, and the recovery says so.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import config as runconfig
from glue.runs import occupancy, remote
from glue.runs.records import AttemptNode
from glue.runs.store import RunStore
from glue.train.run.start import WARM_DIR
from glue.train.storage.credentials import credentials_doc

ARM_SPEC = f"{WARM_DIR}/arm.json"  # what to hold (no secrets: the credentials are a file of their own)
ARM_TIMEOUT_S = 300  # unpacking the live runs' environments (seconds each, from the bucket)


def _follow(entry: dict[str, Any], run: str, rc: runconfig.RunConfig) -> None:
    """`run` followed by a warm process: the first run's declared variables are the ones it loads under
    (glue.train.run.warm_follow), every run's secrets' names are read at run time only."""
    entry["runs"].append(run)
    entry.setdefault("env", dict(rc.env))
    entry["secrets"] = sorted({*entry.get("secrets", []), *rc.secrets})


@dataclass
class LiveRuns:
    """The cluster's live runs by environment: the trainer venv's, and each dependency set's."""

    image: dict[str, Any] = field(default_factory=lambda: {"runs": []})  # {runs, env, secrets}
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # set_sha256 -> {requirements, runs, env, secrets}

    def spec(self) -> dict[str, Any]:
        return {"image": self.image, "envs": list(self.sets.values())}


def live_runs(home: Path) -> LiveRuns:
    """The live runs of the cluster, each with the environment its manifest pins (by run name, last first:
    a spare holds the first sets, glue.train.spare.arm.MAX_ENVS)."""
    live = LiveRuns()
    busy = occupancy.live_on(home, current.hosts(home))
    info, creds = current.bucket_info(home), current.backend(home).bucket_credentials()
    for run in sorted({r for runs in busy.runs.values() for r in runs}, reverse=True):
        try:
            manifest = RunStore(info, creds, run).read_manifest()
            rc, req = runconfig.parse(manifest.config, run, info.name), manifest.requirements
        except GlueError:  # a run whose records glue cannot read holds nothing on the spares; the others do
            continue
        if req and req.get("pins"):
            digest = str(req["set_sha256"])
            held = {"set_sha256": digest, "pins": list(req["pins"]), "pack_sha256": req.get("pack_sha256")}
            entry = live.sets.setdefault(digest, {"requirements": held, "runs": []})
            _follow(entry, run, rc)
        else:
            _follow(live.image, run, rc)
    return live


def _arm_one(home: Path, host: Host, spec: dict[str, Any], creds: bytes) -> dict[str, Any]:
    ssh.put_file(home, host, remote.CREDENTIALS_PATH, creds)
    ssh.put_file(home, host, ARM_SPEC, json.dumps(spec).encode())
    res = ssh.run(home, host, f"{shlex.quote(remote.python(host))} -m glue.train.spare.arm {ARM_SPEC}",
                  timeout=ARM_TIMEOUT_S)
    if res.exit_code != 0:
        lines = res.stderr.strip().splitlines()
        raise GlueError(lines[-1] if lines else f"glue.train.spare.arm exited {res.exit_code}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _said(name: str, done: dict[str, Any]) -> list[str]:
    lines = []
    for env in done.get("envs", []):
        if env.get("environment") == "none":
            lines.append(f"[yellow]spare {name}[/]: dependency set {env['set'][:12]} not held ({env.get('note')}); "
                         "an attempt of it there starts cold")
        elif env.get("warm") not in ("running", "started"):
            lines.append(f"[yellow]spare {name}[/]: set {env['set'][:12]} ready, no warm process ({env.get('warm')})")
    return lines


def arm(home: Path, console: Console, spares: list[Host], live: LiveRuns | None = None) -> list[str]:
    """Warm trainer processes and the live runs' environments on each of `spares` (idle ones only). Returns
    the names where a warm process was started now; a spare that could not be armed is named with why (it
    serves anyway, its attempt starting cold)."""
    if not spares or current.ClusterConfig.load(home).scheduler == "slurm":
        return []  # Slurm starts its jobs there itself (a batch script, never glue.train.run.start): none
    if live is None:
        try:
            live = live_runs(home)
        except GlueError as exc:
            console.print(f"[yellow]spares[/]: the live runs' environments are not held ({exc})")
            live = LiveRuns()
    info = current.bucket_info(home)
    spec = {**live.spec(), "bucket": {"name": info.name, "endpoint": info.endpoint, "region": info.signing_region},
            "credentials_file": remote.CREDENTIALS_PATH}
    creds = credentials_doc(current.backend(home).bucket_credentials())
    started: list[str] = []
    for host in spares:
        try:
            done = _arm_one(home, host, spec, creds)
        except (GlueError, OSError, ValueError) as exc:
            console.print(f"[yellow]spare {host.name}[/]: no warm trainer process ({exc}); an attempt there "
                          "starts cold")
            continue
        for line in _said(host.name, done):
            console.print(line)
        if done.get("trainer") == "started" or any(e.get("warm") == "started" for e in done.get("envs", [])):
            started.append(host.name)
    if started:
        held = f" and {len(live.sets)} run environment(s)" if live.sets else ""
        console.print(f"warm trainer process{held} ready on {', '.join(started)}")
    return started


def after_deploy(home: Path, console: Console, run: str) -> list[str]:
    """A run with requirements of its own just started: the idle spares hold its environment too."""
    if current.ClusterConfig.load(home).spares == 0:  # read before terraform's outputs: most clusters have none
        return []
    req = RunStore.open(home, run).read_manifest().requirements
    spares = current.spares(home) if req and req.get("pins") else []
    if not spares:
        return []
    with console.status(f"spares: making run {run}'s environment ready on {len(spares)} spare(s)"):
        return arm(home, console, spares)


def trainer_start(node: AttemptNode) -> dict[str, str]:
    """How an attempt node's trainer started, from its pids (read into the attempt record's node):
    {"start": "warm"} or {"start": "cold", "cold_reason": why, when a warm process was there}."""
    how = {"start": str(node.start or "cold")}
    if node.cold_reason:
        how["cold_reason"] = str(node.cold_reason)
    return how


def say_start(console: Console, names: list[str], nodes: list[AttemptNode], spares: set[str]) -> None:
    """One line per spare the attempt started on: warm, or cold and why."""
    for name, node in zip(names, nodes, strict=False):
        if name not in spares:
            continue
        how = trainer_start(node)
        if how["start"] == "warm":
            console.print(f"start: the trainer on {name} started warm (the spare's warm trainer process took it)")
        else:
            why = how.get("cold_reason") or "no warm trainer process was waiting on the spare"
            console.print(f"[yellow]start[/]: the trainer on {name} started cold: {why}")

"""Trials of a deployed run's OWN command on a VM of the cluster (any job, not only tiny_gpt).

The run's code and requirements come from the bucket by the hashes its manifest pins, prepared on the VM
exactly as an attempt's are (glue.runs.workspace.prepare, under a probe attempt number of 0 that no
attempt uses). Each trial is the run's command as its attempt runs it, with one config value changed,
started on the VM by `python -m glue.memprobe.vm_trial` under a memory cgroup at the limit; the trainer's
RunContext runs in probe mode (glue.train.run.probe): it stops itself after K whole steps, measures the
step by phase and part, and writes nothing to the run's records. The run's `secrets:` go with each trial's
spec (0600 on the VM's tmpfs, removed by the trial once read), never in an argument, log or report.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.memprobe.runner import ERROR, TrialOutcome
from glue.runs import config as runconfig
from glue.runs import remote, workspace
from glue.runs.records import Manifest
from glue.runs.store import RunStore
from glue.shell_secrets import from_shell
from glue.train.run.launch import TrainerEnv
from glue.train.run.probe import SNAPSHOT
from glue.train.state_paths import StatePaths
from glue.workdir.pin import Workspace

CONFIG_RUN = "memprobe"  # `--config run.yaml`: the name its trials' workspace goes by (no run records are written)
PROBE_ATTEMPT = 0  # the workspace folder of memprobe trials on the VM: no attempt of the run has number 0
PROBE_ROOT = "/var/lib/gpukit/memprobe"
SPEC_NAME = "memprobe-trial.json"
# The breakdown trial: large allocations mapped and unmapped one by one, so the process's RSS follows the live
# tensors (glibc otherwise keeps freed memory in its heap, and RSS stays at its high-water mark).
BREAKDOWN_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def run_config(run: str, manifest: Manifest, bucket: str) -> runconfig.RunConfig:
    raw = manifest.config
    if not isinstance(raw, dict):
        raise GlueError(f"run {run}'s manifest has no run config; it was not deployed by glue deploy")
    return runconfig.parse(raw, run, bucket)


def secrets_env(run: str, rc: runconfig.RunConfig) -> dict[str, str]:
    """The run's `secrets:` from this shell's environment, as deploy hands them to an attempt: a trial of a job
    that needs one (a hub token, a tracker key) runs as the job does. A missing one is one line."""
    return from_shell(rc.secrets, f"run memprobe again: run {run}'s trials run as its attempts do")


def pick_host(home: Path, vm: str | None, failed_on: str | None) -> Host:
    """--vm, else the VM the failed attempt ran on when it is still in the cluster, else the first VM."""
    if vm:
        return current.host(home, vm)
    hosts = current.hosts(home)
    if not hosts:
        raise GlueError("memprobe runs the run's own command on a VM of the cluster, and there is none; "
                        "run `glue up` first")
    return next((h for h in hosts if h.name == failed_on), hosts[0])


def ship(home: Path, host: Host, store: RunStore, rc: runconfig.RunConfig, config_path: Path) -> Workspace:
    """`--config run.yaml` of your own job: its workdir and requirements into the bucket as glue deploy puts them
    (content-addressed: code/<sha256>.tar, the wheelhouse), for the VM to prepare. Returns the manifest's pins."""
    from rich.console import Console

    from glue.workdir import plan as wplan

    plan = wplan.make(rc, config_path, None)
    try:
        return workspace.ship(home, host, store, plan, Console(stderr=True))
    finally:
        plan.close()


def trial_spec(job: JobTrials, cfg: dict[str, Any], changed: dict[str, Any], *, steps: int, limit_mb: int | None,
               mode: str, timeout_s: float, mechanism: str) -> dict[str, Any]:
    """What glue.memprobe.vm_trial runs: the job's command with `cfg` as its config, in probe mode."""
    env = {**job.env, **dataclasses.replace(job.base, config=cfg).to_env()}
    if mode == "breakdown":
        env.update(BREAKDOWN_ENV)
    return {"argv": job.argv, "env": env, "cwd": job.cwd, "changed": changed, "steps": steps, "mode": mode,
            "limit_mb": limit_mb, "mechanism": mechanism, "timeout_s": timeout_s, "probe_dir": job.probe_dir}


def outcome_of(stdout: str, stderr: str, exit_code: int, changed: dict[str, Any], where: str) -> TrialOutcome:
    """vm_trial's one JSON line as a TrialOutcome (an error naming `where` when there is none)."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if exit_code != 0 or not lines:
        tail = (stderr.strip().splitlines() or [f"exit {exit_code}"])[-1]
        return TrialOutcome(status=ERROR, changed=dict(changed), error=f"{where}: {tail}")
    doc = json.loads(lines[-1])
    doc.pop("peak_mb", None)
    doc.pop("snapshot_path", None)
    return TrialOutcome(**doc)


@dataclass
class JobTrials:
    """Prepared once on `host`; then `trial()` per input."""

    home: Path
    store: RunStore
    rc: runconfig.RunConfig
    host: Host
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    base: TrainerEnv

    @classmethod
    def prepare(cls, home: Path, store: RunStore, manifest: Manifest, rc: runconfig.RunConfig,
                host: Host) -> JobTrials:
        if rc.runtime != "process":
            raise GlueError(f"run {store.run} runs as `runtime: {rc.runtime}`; memprobe runs trials of "
                            "`runtime: process` runs (the command on the VM)")
        if not ssh.reachable(home, host):
            raise GlueError(f"{host.name} does not answer SSH; check `glue status`, or pick another with --vm")
        ws = Workspace.from_manifest(manifest)
        argv = list(rc.command)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = remote.python(host)
        ready = None
        if ws.needs_prepare:
            workspace.push_credentials(home, host, store)
            ready = workspace.prepare(home, host, store, ws, PROBE_ATTEMPT)
        folder = f"{PROBE_ROOT}/{store.run}"
        base = TrainerEnv(run=store.run, attempt=PROBE_ATTEMPT, config=dict(rc.config),
                          checkpoint=f"{folder}/checkpoint", outputs=f"{folder}/outputs",
                          bucket_name=store.info.name, scratch=f"{folder}/scratch", vm=host.name,
                          checkpoint_interval=rc.checkpoint.interval_steps, keep_last=rc.checkpoint.keep_last)
        env = {**rc.env, **secrets_env(store.run, rc), **base.to_env()}
        argv, env, cwd = workspace.launch(argv, remote.python(host), env, ready, docker=False)
        return cls(home, store, rc, host, argv, env, cwd, base)

    def trial(self, cfg: dict[str, Any], changed: dict[str, Any], *, steps: int, limit_mb: int | None,
              mode: str = "trial", timeout_s: float = 600.0, mechanism: str = "auto") -> TrialOutcome:
        spec = trial_spec(self, cfg, changed, steps=steps, limit_mb=limit_mb, mode=mode, timeout_s=timeout_s,
                          mechanism=mechanism)
        stdout, stderr, code = self.run_spec(spec, timeout_s + 120)
        return outcome_of(stdout, stderr, code, changed, self.host.name)

    def run_spec(self, spec: dict[str, Any], timeout_s: float) -> tuple[str, str, int]:
        """`python -m glue.memprobe.vm_trial SPEC` on the VM: (stdout, stderr, exit code)."""
        path = StatePaths.of(self.store.run, PROBE_ATTEMPT).workspace_spec.rsplit("/", 1)[0] + "/" + SPEC_NAME
        ssh.put_file(self.home, self.host, path, json.dumps(spec).encode())
        cmd = f"{shlex.quote(remote.python(self.host))} -m glue.memprobe.vm_trial {shlex.quote(path)}"
        res = ssh.run(self.home, self.host, cmd, timeout=timeout_s)
        return res.stdout, res.stderr, res.exit_code

    @property
    def probe_dir(self) -> str:
        return f"{PROBE_ROOT}/{self.store.run}/trial"

    def fetch_snapshot(self) -> bytes | None:
        """The CUDA memory snapshot the last (breakdown) trial left on the VM, base64 over SSH."""
        import base64

        path = f"{self.probe_dir}/{SNAPSHOT}"
        res = ssh.run(self.home, self.host, f"base64 -w0 {shlex.quote(path)}", timeout=300)
        return base64.b64decode(res.stdout) if res.exit_code == 0 and res.stdout else None

"""The monitor: gather evidence about a run's latest attempt, classify it, record an incident.

Evidence comes from the bucket (exit record, error files, heartbeat, log parts, outputs), from the
VM over SSH (process states, py-spy stacks for a stall) and from the backend (is the VM gone?).
An incident is recorded once per failed attempt, before anything is changed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from glue import cluster
from glue.cloud import get_backend
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import remote
from glue.runs.classify import Evidence, Outcome, Verdict, classify
from glue.runs.guard import MOUNT
from glue.runs.store import RunStore, parse_iso, utc_iso


@dataclass
class Report:
    attempt: dict[str, Any]
    evidence: Evidence
    verdict: Verdict
    heartbeat: dict[str, Any] | None
    incident_key: str | None = None


def as_s3_prefix(location: str, bucket: str) -> str | None:
    """A durable location as `prefix` within the bucket (s3://bucket/p or a path under /mnt/s3)."""
    parsed = urlparse(location)
    if parsed.scheme == "s3":
        return parsed.path.strip("/") if parsed.netloc == bucket else None
    path = Path(parsed.path if parsed.scheme == "file" else location)
    return str(path.relative_to(MOUNT)).strip(".") if path.is_relative_to(MOUNT) else None


def missing_outputs(store: RunStore, manifest: dict[str, Any]) -> list[str]:
    outputs = manifest.get("outputs", {})
    prefix = as_s3_prefix(outputs.get("destination", ""), store.info.name)
    if prefix is None:
        return list(outputs.get("required", []))
    have = set()
    for page in store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.info.name, Prefix=prefix + "/"):
        have |= {o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])}
    return [r for r in outputs.get("required", []) if r not in have]


def host_for(home: Path, attempt: dict[str, Any]) -> Host | None:
    for h in cluster.hosts(home):
        if h.name == attempt.get("vm") and h.id == attempt.get("vm_id"):
            return h
    return None


def gather(home: Path, store: RunStore, attempt: dict[str, Any], manifest: dict[str, Any]) -> tuple[Evidence, Any]:
    n = int(attempt["attempt"])
    backend = get_backend(str(attempt.get("backend", "local")), home)
    ev = Evidence(stall_timeout_s=float(manifest["config"].get("monitor", {}).get("stall_timeout_seconds", 60)))
    vm = backend.read_vm(str(attempt.get("vm_id")))
    ev.vm_status = "running" if vm is not None else "gone"
    host = host_for(home, attempt)
    procs: dict[str, Any] = {}
    if vm is not None and host is not None:
        ev.ssh_reachable = ssh.reachable(home, host)
        if ev.ssh_reachable:
            procs = remote.process_state(home, host, store.run, n)
            trainer = procs["trainer"]
            ev.process_alive = trainer not in ("gone", "Z") or procs["supervisor"] not in ("gone", "Z")
            ev.process_stopped = trainer == "T" or trainer == "t"
    else:
        ev.ssh_reachable = False
        ev.process_alive = False
    exit_rec = store.get_json(f"attempts/{n}.exit.json")
    if exit_rec:
        ev.exit_code, ev.exit_signal = exit_rec.get("exit_code"), exit_rec.get("signal")
        ev.oom_kills = int(exit_rec.get("oom_kills") or 0)
        if ev.process_alive and procs.get("supervisor") in ("gone", "Z"):
            ev.process_alive = False
    errors = [store.get_json(k) for k in sorted(store.keys(f"attempts/{n}.error"))]
    ev.error_text = "\n".join(e.get("traceback", "") for e in errors if e)
    ev.log_tail = "\n".join(store.log_text(n).splitlines()[-80:])
    beat = store.get_json("heartbeat.json")
    if beat and beat.get("attempt") != n:
        beat = None
    ev.heartbeat_step = beat.get("step") if beat else None
    since = (beat or {}).get("step_at") or attempt.get("started_at")
    if since:
        ev.heartbeat_age_s = (datetime.now(UTC) - parse_iso(since)).total_seconds()
    if ev.exit_code == 0:
        ev.outputs_missing = missing_outputs(store, manifest)
    return ev, beat


def last_valid_checkpoint(store: RunStore, manifest: dict[str, Any], deep: bool = False) -> int | None:
    """Newest checkpoint step whose COMMIT.json and objects check out (sizes; sha256 when deep)."""
    from glue.train import validate_checkpoints

    prefix = as_s3_prefix(manifest["checkpoint"]["target"], store.info.name)
    if prefix is None:
        return None
    creds = store.creds
    statuses = validate_checkpoints(
        f"s3://{store.info.name}/{prefix}", deep=deep, endpoint_url=store.info.endpoint,
        credentials=lambda: creds, region="us-east-1",
    )
    valid = [s.step for s in statuses if s.valid]
    return max(valid) if valid else None


def capture_stacks(home: Path, host: Host, pid: int) -> str:
    pyspy = f"{remote.venv(host)}/bin/py-spy"
    res = ssh.run(home, host, f"{shlex.quote(pyspy)} dump --pid {pid} 2>&1 || true", timeout=60)
    return res.stdout.strip() or res.stderr.strip()


def check(home: Path, store: RunStore, record_incident: bool = True) -> Report:
    """Classify the latest attempt; on a new failure, write the incident and update the attempt."""
    manifest = store.manifest()
    cluster.refresh_credentials(home)  # a watched run must not lose the bucket when credentials expire
    attempts = store.attempts()
    if not attempts:
        raise GlueError(f"run {store.run!r} has no attempts")
    attempt = store.attempt(attempts[-1])
    ev, beat = gather(home, store, attempt, manifest)
    verdict = classify(ev)
    if attempt.get("failure_class"):
        # Classified before (e.g. a bad restart flagged by the verifier): that verdict stands.
        verdict = Verdict(Outcome(attempt["failure_class"]), str(attempt.get("reason", "")), verdict.excerpt)
    report = Report(attempt=attempt, evidence=ev, verdict=verdict, heartbeat=beat)
    if verdict.outcome is Outcome.RUNNING or attempt.get("failure_class") or attempt.get("outcome"):
        return report
    if verdict.outcome is Outcome.COMPLETED:
        attempt.update(outcome="completed", ended_at=utc_iso(), exit=0, last_step=ev.heartbeat_step)
        store.put_json(f"attempts/{attempt['attempt']}.json", attempt)
        return report
    if record_incident:
        report.incident_key = write_incident(home, store, manifest, attempt, ev, verdict)
    return report


def write_incident(home: Path, store: RunStore, manifest: dict[str, Any], attempt: dict[str, Any], ev: Evidence,
                   verdict: Verdict) -> str:
    stacks = None
    if verdict.outcome is Outcome.STALL:
        host = host_for(home, attempt)
        if host is not None and attempt.get("trainer_pid"):
            stacks = capture_stacks(home, host, int(attempt["trainer_pid"]))
    now = utc_iso()
    env = manifest.get("environment", {})
    incident = {
        "run": store.run, "attempt": attempt["attempt"], "class": str(verdict.outcome), "reason": verdict.reason,
        "policy": verdict.policy, "detected_at": now, "attempt_started_at": attempt.get("started_at"),
        "vm": attempt.get("vm"), "vm_id": attempt.get("vm_id"), "backend": attempt.get("backend"),
        "error_excerpt": verdict.excerpt,
        "input": {"config": manifest.get("config", {}).get("config"), "data": manifest.get("input")},
        "code": manifest.get("code"),
        "environment": {k: env.get(k) for k in ("python", "torch", "cuda", "driver", "gpus", "gpu_type",
                                                "packages_sha256", "hostname")} | {
            "image": manifest.get("image"), "image_digest": manifest.get("image_digest")},
        "last_completed_step": ev.heartbeat_step,
        "last_valid_checkpoint": last_valid_checkpoint(store, manifest),
        "evidence": {"exit_code": ev.exit_code, "signal": ev.exit_signal, "oom_kills": ev.oom_kills,
                     "vm_status": ev.vm_status, "ssh_reachable": ev.ssh_reachable,
                     "process_alive": ev.process_alive, "process_stopped": ev.process_stopped,
                     "heartbeat_age_s": ev.heartbeat_age_s, "outputs_missing": ev.outputs_missing},
        "stacks": stacks,
    }
    if verdict.outcome in (Outcome.OOM_GPU, Outcome.OOM_HOST):
        incident["next_step"] = f"glue memprobe --run {store.run}"
    key = f"incidents/{now.replace(':', '').replace('-', '')}-{verdict.outcome}.json"
    store.put_json(key, incident)
    attempt.update(failure_class=str(verdict.outcome), reason=verdict.reason, ended_at=now, exit=ev.exit_code,
                   signal=ev.exit_signal, last_step=ev.heartbeat_step, incident=key)
    store.put_json(f"attempts/{attempt['attempt']}.json", attempt)
    return key


def incidents(store: RunStore) -> list[dict[str, Any]]:
    store.manifest()
    return [store.get_json(k) for k in sorted(store.keys("incidents/"))]

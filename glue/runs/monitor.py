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
from typing import TYPE_CHECKING, Any

from glue.cloud import get_backend
from glue.cluster import credentials as cluster_credentials
from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import config as runconfig
from glue.runs import guard, lease, memprobe_hint, records, remote, serverless_state, timeline
from glue.runs.classify import STORAGE, AttemptClass, Diagnosis, Evidence, classify
from glue.runs.guard import MOUNT
from glue.runs.records import AttemptNode, AttemptRecord, Manifest
from glue.runs.store import RunStore, parse_iso, utc_iso
from glue.storage import bucket as bucket_store

if TYPE_CHECKING:
    from glue.train.storage.target import Storage


@dataclass
class Report:
    attempt: AttemptRecord
    evidence: Evidence
    diagnosis: Diagnosis
    heartbeat: dict[str, Any] | None
    incident_key: str | None = None


def missing_outputs(store: RunStore, manifest: Manifest) -> list[str]:
    outputs = manifest.outputs
    prefix = bucket_store.as_s3_prefix(outputs.get("destination", ""), store.info.name)
    if prefix is None:
        return list(outputs.get("required", []))
    have = set()
    for page in store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.info.name, Prefix=prefix + "/"):
        have |= {o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])}
    return [r for r in outputs.get("required", []) if r not in have]


@dataclass
class NodeState:
    node: int
    vm: str
    gone: bool
    reachable: bool | None = None
    alive: bool = False
    stopped: bool = False
    exit: dict[str, Any] | None = None
    mount_problem: str | None = None  # the run writes under /mnt/s3 and the mount there is dead
    storage_failing: str | None = None  # the trainer's last words on the VM: its calls to the bucket failing

    @property
    def failed(self) -> bool:
        return self.exit is not None and (self.exit.get("exit_code") != 0 or self.exit.get("signal") is not None)


def _node_state(home: Path, store: RunStore, n: int, backend: Any, nd: AttemptNode,
                uses_mount: bool = False, unreachable: frozenset[str] = frozenset(),
                started_at: str | None = None) -> NodeState:
    k = nd.node
    st = NodeState(node=k, vm=nd.vm, gone=backend.read_vm(str(nd.vm_id)) is None,
                   exit=store.exit_record(n, k))
    host = current.host_of_node(home, nd)
    if st.gone or host is None or str(nd.vm_id) in unreachable:
        st.reachable = False
        return st
    st.reachable = ssh.reachable(home, host)
    if st.reachable:
        procs = remote.process_state(home, host, store.run, n)
        st.alive = procs["trainer"] not in ("gone", "Z") or procs["supervisor"] not in ("gone", "Z")
        st.stopped = procs["trainer"] in ("T", "t")
        failing = [line for line in str(procs.get("log_tail", "")).splitlines() if STORAGE.search(line)]
        if st.alive and failing:  # decides only for a trainer stuck past its stall timeout (classify)
            st.storage_failing = f"the trainer's calls to the bucket fail on {st.vm}: {failing[-1].strip()[:300]}"
        if st.exit is None and not st.alive:
            # The supervisor writes its exit record as its last act: read again now that it is gone,
            # or an attempt that ended between the first read and the process check looks killed.
            st.exit = store.exit_record(n, k)
        if st.exit is not None:
            # The supervisor writes it once the trainer has exited: the attempt ended on this node, even
            # while the supervisor itself is still finishing (a lingering interpreter exit is not a stall).
            st.alive = False
        if uses_mount:
            mount, detail = guard.mount_state(home, host)
            if mount != "live":
                st.mount_problem = f"the bucket mount at {MOUNT} on {st.vm} is {mount}" + (f" ({detail})" if detail
                                                                                           else "")
            elif st.failed and started_at:  # live again: the unit may have brought it back after the trainer's error
                st.mount_problem = guard.mount_restarted_since(home, host, parse_iso(started_at).timestamp())
    return st


def _execution_state(store: RunStore, n: int, attempt: AttemptRecord) -> NodeState:
    """A serverless attempt: its execution is its VM. One that ended without the supervisor's exit record
    (lost by the platform, killed at its cap, aborted) is gone under the trainer."""
    ex = serverless_state.state_of(attempt)
    exit_record = serverless_state.settled_exit(ex, lambda: store.exit_record(n, 0))
    gone = ex is None or (ex.ended and exit_record is None)
    name = f"execution {ex.id} ({ex.state})" if ex is not None else "an execution that never got an id"
    return NodeState(node=0, vm=name, gone=gone, reachable=not gone, exit=exit_record,
                     alive=ex is not None and not ex.ended and exit_record is None)


def failure_timeline(states: list[NodeState], errors: list[dict[str, Any]], beats: list[dict[str, Any]],
                     started_at: str | None) -> list[timeline.Event]:
    """The attempt's failures across ranks and nodes, earliest (the cause) first."""
    events = [timeline.error_event(e) for e in timeline.final_round(errors)]
    erred = {e.node for e in events}
    for st in states:
        if st.gone and st.exit is None:
            mine = [b for b in beats if int(b.get("node") or 0) == st.node]
            seen = max((str(b.get("updated_at")) for b in mine), default=started_at or "")
            events.append(timeline.lost_vm_event(st.node, st.vm, seen, sorted(int(b["rank"]) for b in mine)))
        elif st.failed and st.node not in erred and st.exit is not None:
            events.append(timeline.exit_event(st.node, st.vm, st.exit))
    return timeline.order(events)


def combine(ev: Evidence, states: list[NodeState], errors: list[dict[str, Any]], beats: list[dict[str, Any]],
            started_at: str | None) -> int | None:
    """Judge the group as one run: fill `ev` from every node's state and the ranks' error files.
    Returns the node whose log tail the classifier should read (the cause's). Pure."""
    lost = [st for st in states if st.gone and st.exit is None]
    failed = [st for st in states if st.failed]
    ev.vm_status = "gone" if lost else "running"
    ev.lost_vms = [st.vm for st in lost]
    ev.ssh_reachable = all(st.reachable for st in states)
    # A group runs while every node runs; one failed node means the group is broken.
    ev.process_alive = any(st.alive for st in states) and not lost and not failed
    ev.process_stopped = any(st.stopped for st in states)
    ev.storage_problem = next((st.mount_problem for st in states if st.mount_problem), None) or next(
        (st.storage_failing for st in states if st.storage_failing), None)
    ended = [st for st in states if st.exit is not None]
    if failed:
        pick: NodeState | None = min(failed, key=lambda st: str(st.exit.get("ended_at") if st.exit else ""))
    else:
        pick = ended[0] if ended and len(ended) == len(states) else None
    if pick is not None and pick.exit is not None:
        ev.exit_code, ev.exit_signal = pick.exit.get("exit_code"), pick.exit.get("signal")
    ev.oom_kills = sum(int(st.exit.get("oom_kills") or 0) for st in ended if st.exit)
    events = failure_timeline(states, errors, beats, started_at)
    ev.failure_events = [e.as_dict() for e in events]
    cause = events[0] if events else None
    # Classify by the cause: the consequences (a peer's closed socket) would name the wrong class.
    cause_errors = [e for e in timeline.final_round(errors)
                    if cause is not None and cause.kind == "error" and e.get("rank") == cause.rank]
    ev.error_text = "\n".join(e.get("traceback", "") for e in (cause_errors or errors))
    if cause is not None and cause.node is not None:
        return cause.node
    return pick.node if pick is not None else None


def gather(home: Path, store: RunStore, attempt: AttemptRecord, manifest: Manifest,
           unreachable: frozenset[str] = frozenset()) -> tuple[Evidence, Any]:
    """Evidence about an attempt on all of its nodes, combined so the group is judged as one run.
    unreachable: ids of VMs already known not to answer SSH (glue watch's probe): not tried again."""
    n = attempt.attempt
    backend = get_backend(attempt.backend, home)
    ev = Evidence()
    # Any run may use the mount (its own code reading data or writing logs there), so its state is evidence
    # for every run; it only decides the class when the trainer is stuck or its error is about /mnt/s3.
    states = [_execution_state(store, n, attempt)] if serverless_state.is_serverless(attempt) else \
        [_node_state(home, store, n, backend, nd, uses_mount=True, unreachable=unreachable,
                     started_at=attempt.started_at) for nd in records.nodes_of(attempt)]
    errors = store.errors(n)
    beats = store.heartbeats(n)
    notices = store.notices(n)
    ev.notice = notices[0] if notices else None
    ev.spot = (manifest.environment or {}).get("market") == "spot"
    log_node = combine(ev, states, errors, beats, attempt.started_at)
    ev.log_tail = "\n".join(store.log_text(n, log_node if len(states) > 1 else None).splitlines()[-80:])
    beat = next((b for b in beats if int(b.get("rank", 0)) == 0), None)
    ev.heartbeat_step = beat.get("step") if beat else None
    ev.stall_timeout_s = stall_timeout_s(manifest.monitor, ev.heartbeat_step)
    # No step yet: count from this process's start (a torchrun restart starts late in the attempt).
    since = (beat or {}).get("step_at") or (beat or {}).get("started_at") or attempt.started_at
    if since:
        ev.heartbeat_age_s = (datetime.now(UTC) - parse_iso(since)).total_seconds()
    if beat and beat.get("closed") and beat.get("updated_at"):
        ev.trainer_ended_s = (datetime.now(UTC) - parse_iso(str(beat["updated_at"]))).total_seconds()
    if ev.exit_code == 0:
        ev.outputs_missing = missing_outputs(store, manifest)
    return ev, beat


def stall_timeout_s(monitor: dict[str, Any], step: object) -> float:
    """How long rank 0's heartbeat step may stay unchanged before a live trainer is a stall: the stall timeout,
    and before its first step (imports, data, compilation: minutes for a real job, and a loaded host's seconds)
    the startup's budget, never less."""
    stall = float(monitor.get("stall_timeout_seconds", 60))
    if step is not None:
        return stall
    return max(stall, float(monitor.get("startup_timeout_seconds", runconfig.STARTUP_TIMEOUT_S)))


def checkpoint_storage(store: RunStore, manifest: Manifest) -> Storage | None:
    """The run's checkpoint target in the bucket, as the trainer's own storage layer sees it (None: the
    target is not in the bucket)."""
    from glue.train.storage.target import open_target

    prefix = bucket_store.as_s3_prefix(manifest.checkpoint["target"], store.info.name)
    if prefix is None:
        return None
    creds = store.creds
    return open_target(f"s3://{store.info.name}/{prefix}", endpoint_url=store.info.endpoint,
                       credentials=lambda: creds, region=store.info.signing_region)


def last_valid_checkpoint(store: RunStore, manifest: Manifest, deep: bool = False) -> int | None:
    """Newest checkpoint step whose COMMIT.json and objects check out (sizes; sha256 when deep). The older
    ones are not read: a recovery's validate reads only the checkpoint it resumes from."""
    from glue.train.checkpoint.format import newest_valid

    storage = checkpoint_storage(store, manifest)
    found = newest_valid(storage, deep=deep) if storage is not None else None
    return found.step if found is not None else None


def capture_stacks(home: Path, host: Host, pid: int) -> str:
    """py-spy stacks of the trainer and its children (torchrun's workers are its children)."""
    pyspy = shlex.quote(f"{remote.venv(host)}/bin/py-spy")
    # py-spy pauses the process to read it, which fails on one already stopped (SIGSTOP, state T): that one
    # is read as it stands (--nonblocking; it is not moving anyway).
    script = (f"for p in {pid} $(pgrep -P {pid}); do echo \"== pid $p\"; out=$({pyspy} dump --pid $p 2>&1) || "
              f"out=$({pyspy} dump --nonblocking --pid $p 2>&1); printf '%s\\n' \"$out\"; done || true")
    res = ssh.run(home, host, script, timeout=120)
    return res.stdout.strip() or res.stderr.strip()


def check(home: Path, store: RunStore, record_incident: bool = True,
          unreachable: frozenset[str] = frozenset()) -> Report:
    """Classify the latest attempt; on a new failure, write the incident and update the attempt.
    One SSH connection per node serves the whole poll (reachability, process state, stacks).
    unreachable: ids of VMs the caller found not answering SSH just now (not tried again)."""
    with ssh.session():
        return _check(home, store, record_incident, unreachable)


def trainer_started(attempt: AttemptRecord | None, heartbeat: dict[str, Any] | None) -> bool:
    """Whether the attempt's trainer is known to have started: the deploy (or recover) that recorded the
    attempt recorded its trainer too, or the trainer's own heartbeat names the attempt."""
    if attempt is None:
        return False
    return bool(attempt.trainer_pid or any(nd.trainer_pid for nd in attempt.nodes)
                or (heartbeat or {}).get("attempt") == attempt.attempt)


def _check(home: Path, store: RunStore, record_incident: bool, unreachable: frozenset[str]) -> Report:
    manifest = store.read_manifest()
    cluster_credentials.refresh(home)  # a watched run must not lose the bucket when credentials expire
    attempt = store.latest_attempt()
    if attempt is None:
        raise GlueError(f"run {store.run!r} has no attempts")
    ev, beat = gather(home, store, attempt, manifest, unreachable)
    verdict = classify(ev)
    if verdict.outcome not in (AttemptClass.RUNNING, AttemptClass.COMPLETED) and not trainer_started(attempt, beat):
        # The attempt is recorded a moment before its trainer starts: while the deploy (or recover) that
        # starts it holds the run's lease, nothing has failed yet; once it is gone, it was what was killed.
        holder = lease.held_elsewhere(store)
        if holder is not None:
            verdict = Diagnosis(AttemptClass.RUNNING, f"starting: {holder['op']} ({holder['holder']}) has not started "
                                               "the trainer yet")
        elif verdict.outcome is AttemptClass.KILLED and not ev.process_alive:
            verdict = Diagnosis(AttemptClass.KILLED, f"the trainer of attempt {attempt.attempt} never started: the "
                                              "deploy or recover that recorded it stopped first", verdict.excerpt)
    if attempt.failure_class:
        # Classified before (e.g. a bad restart flagged by the verifier): that verdict stands.
        verdict = Diagnosis(AttemptClass(attempt.failure_class), str(attempt.reason or ""), verdict.excerpt)
    report = Report(attempt=attempt, evidence=ev, diagnosis=verdict, heartbeat=beat)
    if verdict.outcome is AttemptClass.RUNNING or attempt.ended:
        return report
    if verdict.outcome is AttemptClass.COMPLETED:
        attempt.update(outcome="completed", ended_at=utc_iso(), exit=0,
                       last_step=last_completed_step(store, attempt.attempt, ev))
        store.put_attempt(attempt)
        return report
    if record_incident:
        report.incident_key = write_incident(home, store, manifest, attempt, ev, verdict)
    return report


def last_completed_step(store: RunStore, n: int, ev: Evidence, ckpt: int | None = None) -> int | None:
    """The furthest step attempt n is known to have completed: the heartbeat is written every few seconds
    and lags the shipped metrics (and a checkpoint of this attempt) when a VM dies between two beats."""
    own = [*(store.metrics().get(n) or {}), *([ev.heartbeat_step] if ev.heartbeat_step is not None else [])]
    # The first attempt wrote every checkpoint there is; a later one without a step of its own may only
    # have read it (its resume point), which is no progress of its own.
    if ckpt is not None and (n == 1 or own):
        own.append(ckpt)
    return max(own) if own else None


def write_incident(home: Path, store: RunStore, manifest: Manifest, attempt: AttemptRecord, ev: Evidence,
                   verdict: Diagnosis) -> str:
    stacks = None
    if verdict.outcome is AttemptClass.STALL:
        dumps = []
        for nd in records.nodes_of(attempt):
            host = current.host_of_node(home, nd)
            pid = nd.trainer_pid or (attempt.trainer_pid if nd.node == 0 else None)
            if host is not None and pid:
                dumps.append(f"=== node {nd.node} ({host.name})\n" + capture_stacks(home, host, int(pid)))
        stacks = "\n".join(dumps) or None
    now = utc_iso()
    env = manifest.environment
    ckpt = last_valid_checkpoint(store, manifest)
    incident = {
        "run": store.run, "attempt": attempt.attempt, "class": str(verdict.outcome), "reason": verdict.reason,
        "policy": verdict.policy, "detected_at": now, "attempt_started_at": attempt.started_at,
        "vm": attempt.vm, "vm_id": attempt.vm_id, "backend": attempt.backend,
        "error_excerpt": verdict.excerpt,
        "input": {"config": manifest.config.get("config"), "data": manifest.input},
        "code": manifest.code,
        "environment": {k: env.get(k) for k in ("python", "torch", "cuda", "driver", "gpus", "gpu_type",
                                                "packages_sha256", "hostname")} | {
            "image": manifest.image, "image_digest": manifest.image_digest},
        "last_completed_step": last_completed_step(store, attempt.attempt, ev, ckpt),
        "last_valid_checkpoint": ckpt,
        "evidence": {"exit_code": ev.exit_code, "signal": ev.exit_signal, "oom_kills": ev.oom_kills,
                     "vm_status": ev.vm_status, "ssh_reachable": ev.ssh_reachable,
                     "process_alive": ev.process_alive, "process_stopped": ev.process_stopped,
                     "heartbeat_age_s": ev.heartbeat_age_s, "outputs_missing": ev.outputs_missing},
        "stacks": stacks,
        # Across ranks: the earliest failure is the cause, the later ones its consequences.
        "cause": ev.failure_events[0] if ev.failure_events else None,
        "consequences": ev.failure_events[1:],
        "nodes": [{"node": nd.node, "vm": nd.vm, "vm_id": nd.vm_id}
                  for nd in records.nodes_of(attempt)],
    }
    if verdict.outcome in (AttemptClass.OOM_GPU, AttemptClass.OOM_HOST):
        incident["next_step"] = memprobe_hint.command(store.run, manifest.config)  # one that works for this run
    key = store.put_incident(incident, str(verdict.outcome), now)
    attempt.update(failure_class=str(verdict.outcome), reason=verdict.reason, ended_at=now, exit=ev.exit_code,
                   signal=ev.exit_signal, last_step=incident["last_completed_step"], incident=key)
    store.put_attempt(attempt)
    return key


def incidents(store: RunStore) -> list[dict[str, Any]]:
    store.read_manifest()
    return store.incidents()

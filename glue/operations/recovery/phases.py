"""The phases of `glue recover`, one function each, in the order of the recovery table:
detect, validate, provision, configure, verify, prepare (a run with a workdir or requirements), start,
replay, check, record.

Each phase takes what earlier phases found and returns what later ones need; `recover()` in
recover.py strings them together and times them (`Timings`).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import current
from glue.errors import GlueError
from glue.infra import inventory, ssh
from glue.infra.inventory import Host
from glue.infra.terraform import vm_address
from glue.operations import converge, convergence, lifecycle
from glue.operations.recovery.resume_check import ResumeCheck, check_all_ranks, check_resharded, merged_metrics
from glue.runs import attempt as attempt_mod
from glue.runs import config as runconfig
from glue.runs import guard, memprobe_hint, monitor, records, remote, serverless_state, workspace
from glue.runs.class_policy import policy_of
from glue.runs.classify import AttemptClass
from glue.runs.records import AttemptNode, AttemptRecord, Manifest, RecoveryRecord
from glue.runs.store import RunStore, parse_iso, utc_iso
from glue.runs.vm_group import GroupSpec
from glue.storage import bucket as bucket_store
from glue.train import trainer_vars
from glue.workdir.pin import Workspace


def secs_between(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return round((parse_iso(b) - parse_iso(a)).total_seconds(), 3)


class Timings(dict[str, float]):
    """Seconds per controller-timed phase; `phase()` shows a spinner while one runs."""

    @contextmanager
    def phase(self, console: Console, name: str, what: str) -> Iterator[None]:
        t0 = time.monotonic()
        with console.status(f"[bold]{name}[/]: {what} …"):
            yield
        self[name] = round(time.monotonic() - t0, 3)


@dataclass
class Failure:
    """What detect found: the failed attempt and when it stopped showing signs of life."""

    outcome: AttemptClass
    number: int
    attempt: AttemptRecord
    heartbeat: dict[str, Any]
    last_alive: str | None
    detected_at: str


@dataclass
class Lost:
    """What validate found: the checkpoint to resume from and the work the failure cost."""

    rc: runconfig.RunConfig
    ckpt: int | None
    old_metrics: dict[int, dict[str, Any]]
    failure_step: int
    finished_before: bool  # the lost attempt had written every required output
    group: GroupSpec
    ws: Workspace  # the user's code and requirements, as the manifest pins them (never the local folder)


# -- detect -------------------------------------------------------------------------------------------
def detect(home: Path, store: RunStore, force: bool) -> Failure:
    """Classify the last attempt; refuse what a restart does not repair (unless forced)."""
    run_id = store.run
    report = monitor.check(home, store)
    outcome, reason = report.diagnosis.outcome, report.diagnosis.reason
    policy = policy_of(outcome)
    if policy.refuse_always is not None:
        raise GlueError(policy.refuse_always.format(run=run_id, reason=reason, missing=reason.split(": ", 1)[-1]))
    if policy.refuse_without_force is not None and not force:
        hint = memprobe_hint.command(run_id, store.read_manifest().config) \
            if outcome in (AttemptClass.OOM_GPU, AttemptClass.OOM_HOST) else ""
        memprobe = f"`{hint}`" if hint.startswith("glue memprobe") else f"a probe of your own ({hint})"
        raise GlueError(f"run {run_id} failed with {outcome}: "
                        + policy.refuse_without_force.format(run=run_id, memprobe=memprobe))
    n = report.attempt.attempt
    attempt = store.read_attempt(n) or report.attempt  # re-read: the monitor just recorded the incident into it
    beat = report.heartbeat or {}
    last_alive = beat.get("step_at") or attempt.started_at
    detected_at = attempt.ended_at or utc_iso()
    incident = store.incident(attempt.incident) if attempt.incident else None
    if incident:
        detected_at = incident["detected_at"]
        # In a group the cause's time (a lost VM's last heartbeat, the first error) is the failure's.
        last_alive = (incident.get("cause") or {}).get("at") or last_alive
    return Failure(outcome, n, attempt, beat, last_alive, detected_at)


# -- validate -----------------------------------------------------------------------------------------
def validate(store: RunStore, manifest: Manifest, failure: Failure, from_scratch: bool) -> Lost:
    """The newest valid checkpoint, checked from the controller (sizes and sha256)."""
    rc = runconfig.parse(manifest.config, store.run, store.info.name)
    ckpt = monitor.last_valid_checkpoint(store, manifest, deep=True)
    if ckpt is None and not from_scratch:
        raise GlueError(f"run {store.run} has no valid checkpoint in {rc.checkpoint.target}; "
                        "restart it from step 0 with --from-scratch")
    old_metrics = merged_metrics(store, failure.number + 1)
    failure_step = max(old_metrics) if old_metrics else (failure.heartbeat.get("step") or 0)
    finished_before = bool(manifest.outputs.get("required")) and not monitor.missing_outputs(store, manifest)
    return Lost(rc, ckpt, old_metrics, failure_step, finished_before, GroupSpec.from_manifest(manifest),
                Workspace.from_manifest(manifest))


# -- provision ----------------------------------------------------------------------------------------
def keepable(home: Path, failure: Failure, keep_failed: bool) -> list[lifecycle.KeptVM]:
    """The failed VMs to keep for debugging: asked for, a class where the VMs themselves still work, and
    every VM of the attempt that is still there (a group keeps all its live nodes, frozen together: its
    ranks' stacks and state belong together). [] = replace them as usual."""
    if not keep_failed or not policy_of(failure.outcome).keepable:
        return []
    backend = current.backend(home)
    kept: list[lifecycle.KeptVM] = []
    for nd in records.nodes_of(failure.attempt):
        host = current.host_of_node(home, nd)
        if host is None or backend.read_vm(host.id) is None:
            continue
        kept.append(lifecycle.KeptVM(name=host.name, id=host.id, ssh_host=host.ssh_host, ssh_port=host.ssh_port,
                                     ssh_user=host.ssh_user, host_key=host.host_key,
                                     run=failure.attempt.run, attempt=failure.number,
                                     failure_class=str(failure.outcome), kept_at=utc_iso()))
    return kept


def kill_attempt(home: Path, store: RunStore, attempt: AttemptRecord,
                 freeze: list[lifecycle.KeptVM] | None = None) -> None:
    """Stop what is left of an attempt on every node still reachable: a stalled or half-dead trainer
    (or a surviving rank waiting in the rendezvous) must not write on. On a VM kept for debugging the
    processes are frozen (SIGSTOP) instead of killed. A serverless attempt's execution is aborted."""
    if serverless_state.is_serverless(attempt):
        serverless_state.abort(attempt)
        return
    backend = current.backend(home)
    frozen = {k.id for k in freeze or []}
    for nd in records.nodes_of(attempt):
        host = current.host_of_node(home, nd)
        # A VM the backend calls gone is not probed: a hung host (an ssh backend's lost one) answers only by
        # its SSH timeout, seconds of every recovery onto a spare.
        if host is None or backend.read_vm(host.id) is None or not ssh.reachable(home, host):
            continue
        try:
            # SIGSTOP on a kept VM: frozen, a kept trainer keeps its stacks and memory for py-spy or gdb, and
            # writes nothing more (no heartbeat over the new attempt's).
            remote.signal_processes(home, host, store.run, attempt.attempt, "STOP" if host.id in frozen else "KILL")
        except GlueError:
            if backend.read_vm(host.id) is not None:
                raise
            # The VM went while we spoke to it (a preempted VM's grace ran out): nothing left to stop.


def provision(home: Path, console: Console, nodes: list[AttemptNode], same_vm: bool,
              keep: list[lifecycle.KeptVM] | None = None) -> tuple[list[Host], list[str]]:
    """Terraform brings the group's VMs back: a lost VM is drift (re-created by the apply); the live VM
    of a single-node run is replaced too unless --same-vm; a group keeps its live VMs. A VM to `keep`
    leaves Terraform's state alive and a new one takes its name. Returns the hosts in node order and
    the names of the new VMs."""
    keep = keep or []
    cfg = current.ClusterConfig.load(home)
    gone = [nd.vm for nd in nodes if nd.vm not in cfg.vm_names()]
    if gone:
        prefix, _, index = gone[0].rpartition("-")
        vms = max([cfg.vms, *(int(g.rpartition("-")[2]) for g in gone if g.rpartition("-")[2].isdigit())])
        back = f"`glue up --vms {vms} --name-prefix {prefix}`" if prefix and index.isdigit() else "`glue up`"
        raise GlueError(f"the run's VM {', '.join(gone)} is no longer part of this cluster (it asks for "
                        f"{', '.join(cfg.vm_names())}): bring the name back with {back}, then recover again")
    backend = get_backend(cfg.backend, home)
    replace = [vm_address(nd.vm) for nd in nodes
               if len(nodes) == 1 and not same_vm and not keep and backend.read_vm(str(nd.vm_id)) is not None]
    with converge.applying(home, cfg.backend, console, converge.image_hash(cfg.backend, home)) as step:
        for vm in keep:
            step.tf.state_rm(vm_address(vm.name))  # the kept VM lives on outside the state
            lifecycle.keep(home, vm)
        step.tf.apply(current.tf_vars(home, cfg), replace=replace)
        step.settle()
        inventory.write(home, step.tf.outputs(), also_known=lifecycle.kept_host_keys(home))
    hosts = [current.host(home, nd.vm) for nd in nodes]
    return hosts, [h.name for h, nd in zip(hosts, nodes, strict=True) if h.id != nd.vm_id]


def alive(home: Path, attempt: AttemptRecord) -> list[Host]:
    """The attempt's VMs that are still there and answer, in node order."""
    backend = current.backend(home)
    return [h for h in (current.host_of_node(home, nd) for nd in records.nodes_of(attempt))
            if h is not None and backend.read_vm(h.id) is not None and ssh.reachable(home, h)]


def survivors(home: Path, failure: Failure, nodes: int) -> list[Host]:
    """`glue recover --nodes M` on fewer VMs: the first M of the attempt's VMs that are still there and
    answer (node order), for a group whose lost VMs cannot be replaced. Nothing is provisioned."""
    attempt_nodes = records.nodes_of(failure.attempt)
    if nodes > len(attempt_nodes):
        raise GlueError(f"--nodes {nodes}: the run ran on {len(attempt_nodes)} VM(s); a recovery continues it on "
                        "as many or fewer, never more")
    live = alive(home, failure.attempt)
    if len(live) < nodes:
        raise GlueError(f"--nodes {nodes}: only {len(live)} of the run's {len(attempt_nodes)} VMs are alive "
                        f"({', '.join(h.name for h in live) or 'none'}); use --nodes {len(live)} or fewer, or "
                        "recover without --nodes to replace the lost ones")
    return live[:nodes]


# -- configure ----------------------------------------------------------------------------------------
def configure(home: Path, console: Console, fresh: list[Host]) -> converge.Converged:
    """The playbook on the new VMs (bucket mount, trainer runtime); on a VM the run keeps (`--same-vm`, a
    stalled VM) only when its configuration changed since it was converged or it fails the live check.
    Recorded, so the next `glue up` leaves them be while nothing changes. Returns the VMs the playbook
    converged and those that configured themselves from the seed."""
    parts = convergence.vm_parts(home, converge.image_hash(current.ClusterConfig.load(home).backend, home))
    why = converge.stale(home, fresh, parts)
    for host in fresh:
        if host.name not in why:
            console.print(f"configure: {host.name} is unchanged since it was converged and its mount is live: "
                          "no playbook")
    # The verify phase follows: verified there, not here.
    return converge.converge(home, console, fresh, parts, why=why, verify=False)


# -- verify -------------------------------------------------------------------------------------------
def checkpoint_on_vm(home: Path, host: Host, store: RunStore, target: str) -> int | None:
    """Read the newest valid checkpoint back FROM THE NEW VM (deep: sizes and sha256)."""
    workspace.push_credentials(home, host, store)
    env = (f"{trainer_vars.CREDENTIALS_FILE}={remote.CREDENTIALS_PATH} "
           f"{trainer_vars.BUCKET_ENDPOINT}={shlex.quote(store.info.endpoint)}")
    res = ssh.run(home, host, f"{env} {shlex.quote(remote.python(host))} -m glue.train.checkpoint.check "
                  f"{shlex.quote(target)}", timeout=600)
    if res.exit_code != 0:
        raise GlueError(f"{host.name}: reading the checkpoint back failed: {res.stderr.strip().splitlines()[-1:]}")
    latest = json.loads(res.stdout.strip().splitlines()[-1])["latest_valid"]
    return int(latest) if latest is not None else None


def verify(home: Path, store: RunStore, lost: Lost, hosts: list[Host], fresh: list[str]) -> list[list[str]]:
    """Boundary guard on every node, the checkpoint read back on each new VM, the command present.
    Returns each node's checked command."""
    target_prefix = bucket_store.as_s3_prefix(lost.rc.checkpoint.target, store.info.name)
    target = f"s3://{store.info.name}/{target_prefix}" if target_prefix is not None else lost.rc.checkpoint.target

    def guarded(host: Host) -> None:
        for what, location in lost.rc.locations().items():
            guard.check_location(home, host, store, what, location)

    def read_back(host: Host) -> None:
        on_vm = checkpoint_on_vm(home, host, store, target)
        if on_vm != lost.ckpt:
            raise GlueError(f"{host.name} sees latest valid checkpoint {on_vm}, the controller {lost.ckpt}; "
                            "not resuming")

    # The checks are independent and mostly waiting on SSH: all at once, every failure said in this order.
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpukit-verify") as pool:
        guards = [pool.submit(guarded, h) for h in hosts]
        reads = [pool.submit(read_back, h) for h in hosts if h.name in fresh]
        commands = [pool.submit(attempt_mod.check_command, home, h, lost.rc, lost.ws) for h in hosts]
        for fut in (*guards, *reads):
            fut.result()
        return [fut.result() for fut in commands]


# -- prepare ------------------------------------------------------------------------------------------
def prepare(home: Path, store: RunStore, lost: Lost, failure: Failure,
            hosts: list[Host]) -> list[dict[str, Any] | None]:
    """The run's code and requirements on every node, from the bucket by the manifest's hashes (never
    from the controller's folder): a package or wheel that does not match refuses here."""
    return next_attempt(home, store, lost, failure, hosts).prepare()


# -- start --------------------------------------------------------------------------------------------
def start(home: Path, store: RunStore, lost: Lost, failure: Failure, hosts: list[Host],
          argvs: list[list[str]], ready: list[dict[str, Any] | None] | None = None,
          group: GroupSpec | None = None) -> AttemptRecord:
    """The next attempt, resuming, on the group's hosts (`group`: a smaller one). Returns its attempt record."""
    return next_attempt(home, store, lost, failure, hosts, group).start(argvs, ready)


def next_attempt(home: Path, store: RunStore, lost: Lost, failure: Failure, hosts: list[Host],
                 group: GroupSpec | None = None) -> attempt_mod.Attempt:
    """The attempt after the failed one: resuming, with its memory limit, the run's pinned workspace."""
    return attempt_mod.Attempt(home, store, lost.rc, hosts, failure.number + 1, resume=True,
                               memory_limit_mb=failure.attempt.memory_limit_mb, group=group or lost.group,
                               ws=lost.ws)


def record_group(store: RunStore, manifest: Manifest, group: GroupSpec, attempt: int) -> None:
    """The run continues as `group` from `attempt` on: the manifest says so (the next recovery and `glue
    watch` re-form this group), and keeps the change in its history."""
    before = manifest.distributed
    manifest.distributed = group.as_dict() if group.distributed else None
    manifest.group_changes = [*(manifest.group_changes or []),
                              {"attempt": attempt, "from": before, "to": manifest.distributed, "at": utc_iso()}]
    store.put_manifest(manifest)


# -- check --------------------------------------------------------------------------------------------
def check(store: RunStore, lost: Lost, failure: Failure, new_metrics: dict[int, Any], upto: int,
          tolerance: float, group: GroupSpec | None = None, reshard_tolerance: float = 0.1) -> ResumeCheck:
    """First resumed step == checkpoint + 1 and equal losses where both attempts ran, on every rank. On
    another world size (`group`): the data position exactly, the losses within reshard_tolerance."""
    if group is not None and group.world_size != lost.group.world_size:
        return check_resharded(lost.old_metrics, new_metrics, lost.ckpt, min(upto, lost.failure_step),
                               reshard_tolerance)
    return check_all_ranks(store, lost.old_metrics, new_metrics, failed_attempt=failure.number,
                           new_attempt=failure.number + 1, world_size=lost.group.world_size, ckpt=lost.ckpt,
                           upto=min(upto, lost.failure_step), tolerance=tolerance,
                           finished_before=lost.finished_before)


def flag_bad_restart(home: Path, store: RunStore, manifest: Manifest, attempt_n: int,
                     result: ResumeCheck) -> tuple[list[int], str | None]:
    """Stop the wrongly resumed attempt and keep the evidence as a bad_restart incident. The checkpoints it
    committed (COMMIT.json written since the attempt started: any step, also one it rewrote at or below
    its resume point) continue the wrong trajectory: they are marked rejected, so no later resume starts
    from them; nothing is deleted. Returns the steps marked, and why marking failed (None: it did not)."""
    from glue.train.checkpoint.format import check_checkpoints, reject  # the storage layer: only when needed
    from glue.train.errors import CheckpointError

    attempt = store.read_attempt(attempt_n)
    if attempt is None:
        raise GlueError(f"run {store.run} has no attempt {attempt_n} to flag as a bad restart")
    kill_attempt(home, store, attempt)
    ev = monitor.Evidence(resume_problem=result.problem, heartbeat_step=result.first_step)
    monitor.write_incident(home, store, manifest, attempt, ev, monitor.classify(ev))
    since = parse_iso(attempt.started_at)
    try:
        storage = monitor.checkpoint_storage(store, manifest)
        if storage is None:
            return [], None
        mine = [st.step for st in check_checkpoints(storage, deep=False)
                if st.commit is not None and _created_since(st.commit.created_at, since)]
        why = f"bad_restart of attempt {attempt_n}: {result.problem}"
        return reject(storage, mine, why, f"glue ({store.run})"), None
    except CheckpointError as exc:  # the bucket failed us: say so, the evidence is already kept
        return [], f"its checkpoints could not be marked rejected ({exc}); do not resume from one it committed"


def _created_since(created_at: str, since: datetime) -> bool:
    try:
        return parse_iso(created_at) >= since
    except ValueError:  # no readable time: a checkpoint of unknown origin is not marked
        return False


# -- record -------------------------------------------------------------------------------------------
def record(store: RunStore, result: RecoveryRecord) -> int:
    """The run's next recovery record (RunStore.add_recovery): the phases, the work lost, the verdict; returns
    its number."""
    return store.add_recovery(result)

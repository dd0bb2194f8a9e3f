"""`glue recover`: move a failed run onto a newly provisioned VM and prove the resume is exact.

Phases (each timed into runs/<run>/recoveries/<n>.json):
  detect     last sign of life of the failed attempt -> failure classified
  validate   the checkpoints in the bucket checked from the controller (sizes, sha256)
  provision  terraform replaces the VM (a lost VM is drift; a live one is -replace'd)
  configure  the Ansible playbook on the new VM (bucket mount, trainer runtime)
  verify     boundary guard, checkpoint read back on the new VM, command present
  restore    trainer start -> first resumed step (process start + checkpoint load + one step)
  replay     first resumed step -> the step the failed attempt had reached (work redone)
Then: first resumed step == checkpoint step + 1, and the losses of the first resumed steps equal
the pre-failure metrics at the same steps (exactly on CPU; --tolerance for GPU), on every rank.
A multi-node run (deploy --nodes N) is recovered as a group: the lost VMs are replaced, the live
ones kept, what is left of the attempt is killed on every node, and the group re-forms.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from glue.cloud import get_backend
from glue.cluster import lifecycle, state
from glue.errors import GlueError
from glue.infra import inventory, ssh
from glue.infra.inventory import Host
from glue.infra.terraform import Terraform
from glue.runs import config as runconfig
from glue.runs import deploy as deploy_mod
from glue.runs import guard, monitor, remote
from glue.runs.classify import Outcome
from glue.runs.store import RunStore, parse_iso, utc_iso
from glue.runs.vm_group import GroupSpec

REFUSE_WITHOUT_FORCE = {
    Outcome.OOM_GPU: "restarting does not repair a repeatable memory failure; investigate with "
                     "`glue memprobe --run {run}` and change the input, or pass --force",
    Outcome.OOM_HOST: "restarting does not repair a repeatable memory failure; investigate with "
                      "`glue memprobe --run {run}` and change the input, or pass --force",
    Outcome.BAD_RESTART: "the last resume was wrong; fix the trainer (see `glue incidents --run {run}`), "
                         "or pass --force",
    Outcome.USER_ERROR: "the trainer failed with an error of its own (see `glue incidents --run {run}`); "
                        "fix it, or pass --force",
}


@dataclass
class ResumeCheck:
    ok: bool
    first_step: int | None
    compared: list[int] = field(default_factory=list)
    problem: str | None = None


def _secs(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return round((parse_iso(b) - parse_iso(a)).total_seconds(), 3)


def _phase(console: Console, name: str) -> Any:
    return console.status(f"[bold]{name}[/] …")


def merged_metrics(store: RunStore, before_attempt: int, rank: int = 0) -> dict[int, dict[str, Any]]:
    """step -> record of one rank from the attempts before `before_attempt` (a later attempt overrides)."""
    out: dict[int, dict[str, Any]] = {}
    for att, steps in sorted(store.metrics(rank).items()):
        if att < before_attempt:
            out.update(steps)
    return out


def check_resume(old: dict[int, dict[str, Any]], new: dict[int, dict[str, Any]], ckpt: int | None,
                 upto: int, tolerance: float, finished_before: bool = False) -> ResumeCheck:
    """The first resumed step must be ckpt + 1; losses at steps both attempts ran must agree.

    `new` empty means the resumed attempt exited 0 without a step. That is right only when the lost
    attempt had finished training (`finished_before`: it wrote every required output) and the
    checkpoint is the last step it reached: the VM died between the end of training and the exit.
    """
    if not new:
        if finished_before and ckpt is not None and old and ckpt >= max(old):
            return ResumeCheck(True, None)
        return ResumeCheck(False, None, problem="the resumed attempt reported no steps")
    first = min(new)
    want = (ckpt or 0) + 1
    if first != want:
        return ResumeCheck(False, first, problem=f"first resumed step {first} != checkpoint step {ckpt} + 1")
    compared: list[int] = []
    for step in range(want, upto + 1):
        if step not in old or step not in new:
            continue
        a, b = float(old[step]["loss"]), float(new[step]["loss"])
        if abs(a - b) > tolerance:
            what = [k for k in ("batch", "rng") if k in old[step] and old[step].get(k) != new[step].get(k)]
            hint = f" (step inputs differ: {', '.join({'batch': 'data position', 'rng': 'rng'}[k] for k in what)})" \
                if what else ""
            return ResumeCheck(False, first, compared, f"loss at step {step} is {b!r} after the resume, {a!r} "
                               f"before the failure (tolerance {tolerance}){hint}")
        compared.append(step)
    return ResumeCheck(True, first, compared)


def _kill_attempt(home: Path, store: RunStore, attempt: dict[str, Any]) -> None:
    """Stop what is left of an attempt on every node still reachable: a stalled or half-dead trainer
    (or a surviving rank waiting in the rendezvous) must not write on."""
    for nd in monitor.nodes_of(attempt):
        host = monitor.host_for(home, nd)
        if host is not None and ssh.reachable(home, host):
            remote.kill_attempt(home, host, store.run, int(attempt["attempt"]))


def _verify_checkpoint_on_vm(home: Path, host: Host, store: RunStore, target: str) -> int | None:
    """Read the newest valid checkpoint back FROM THE NEW VM (deep: sizes and sha256)."""
    creds = store.creds
    ssh.put_file(home, host, remote.CREDENTIALS_PATH, json.dumps({
        "access_key": creds.access_key, "secret_key": creds.secret_key, "session_token": creds.session_token,
        "expires_at": creds.expires_at}).encode())
    env = (f"GPUKIT_CREDENTIALS_FILE={remote.CREDENTIALS_PATH} "
           f"GPUKIT_BUCKET_ENDPOINT={shlex.quote(store.info.endpoint)}")
    res = ssh.run(home, host, f"{env} {shlex.quote(remote.python(host))} -m glue.train.ckptcheck "
                  f"{shlex.quote(target)}", timeout=600)
    if res.exit_code != 0:
        raise GlueError(f"{host.name}: reading the checkpoint back failed: {res.stderr.strip().splitlines()[-1:]}")
    latest = json.loads(res.stdout.strip().splitlines()[-1])["latest_valid"]
    return int(latest) if latest is not None else None


def provision(home: Path, console: Console, nodes: list[dict[str, Any]], same_vm: bool) -> tuple[list[Host], list[str]]:
    """Terraform brings the group's VMs back: a lost VM is drift (re-created by the apply); the live VM
    of a single-node run is replaced too unless --same-vm; a group keeps its live VMs. Returns the
    hosts in node order and the names of the new VMs."""
    cfg = state.ClusterConfig.load(home)
    backend = get_backend(cfg.backend, home)
    tf = Terraform(home, cfg.backend, console)
    replace = [f'gpukit_vm.node["{nd["vm"]}"]' for nd in nodes
               if len(nodes) == 1 and not same_vm and backend.read_vm(str(nd["vm_id"])) is not None]
    tf.apply(state.tf_vars(home, cfg), replace=replace)
    inventory.write(home, tf.outputs())
    hosts = [state.host(home, str(nd["vm"])) for nd in nodes]
    return hosts, [h.name for h, nd in zip(hosts, nodes, strict=True) if h.id != nd["vm_id"]]


def recover(home: Path, run_id: str, console: Console, force: bool = False, from_scratch: bool = False,
            same_vm: bool = False, verify_steps: int = 5, tolerance: float = 0.0,
            wait_timeout: float = 600.0) -> dict[str, Any]:
    store = deploy_mod.open_store(home, run_id)
    manifest = store.manifest()  # unknown run -> one line
    with _phase(console, "detect: classifying the last attempt"):
        report = monitor.check(home, store)
    outcome = report.verdict.outcome
    if outcome is Outcome.RUNNING:
        raise GlueError(f"run {run_id} is healthy ({report.verdict.reason}); nothing to recover")
    if outcome is Outcome.COMPLETED:
        raise GlueError(f"run {run_id} completed; nothing to recover")
    if outcome is Outcome.EXPORT_MISSING:
        raise GlueError(f"run {run_id} finished but {report.verdict.reason.split(': ', 1)[-1]}; that is not fixed "
                        "by a restart: export the outputs")
    if outcome in REFUSE_WITHOUT_FORCE and not force:
        raise GlueError(f"run {run_id} failed with {outcome}: " + REFUSE_WITHOUT_FORCE[outcome].format(run=run_id))
    attempt = report.attempt
    n = int(attempt["attempt"])
    attempt = store.attempt(n)  # re-read: the monitor just recorded the incident into it
    beat = report.heartbeat or {}
    last_alive = beat.get("step_at") or attempt.get("started_at")
    detected_at = attempt.get("ended_at") or utc_iso()
    incident = store.get_json(str(attempt.get("incident"))) if attempt.get("incident") else None
    if incident:
        detected_at = incident["detected_at"]
        # In a group the cause's time (a lost VM's last heartbeat, the first error) is the failure's.
        last_alive = (incident.get("cause") or {}).get("at") or last_alive

    rc = runconfig.parse(manifest["config"], run_id, store.info.name)
    target_prefix = monitor.as_s3_prefix(rc.checkpoint.target, store.info.name)
    t0 = time.monotonic()
    with _phase(console, "checking the checkpoints in the bucket (sizes and sha256)"):
        ckpt = monitor.last_valid_checkpoint(store, manifest, deep=True)
    validate_s = time.monotonic() - t0
    if ckpt is None and not from_scratch:
        raise GlueError(f"run {run_id} has no valid checkpoint in {rc.checkpoint.target}; "
                        "restart it from step 0 with --from-scratch")
    group = GroupSpec.from_manifest(manifest)
    old_metrics = merged_metrics(store, n + 1)
    failure_step = max(old_metrics) if old_metrics else (beat.get("step") or 0)
    finished_before = bool(manifest.get("outputs", {}).get("required")) and not monitor.missing_outputs(store, manifest)
    nodes = monitor.nodes_of(attempt)

    t0 = time.monotonic()
    names = ", ".join(str(nd["vm"]) for nd in nodes)
    with _phase(console, f"provision: VMs for {names} (terraform)"):
        _kill_attempt(home, store, attempt)
        hosts, replaced = provision(home, console, nodes, same_vm)
    provision_s = time.monotonic() - t0
    fresh = replaced or [h.name for h in hosts]
    t0 = time.monotonic()
    with _phase(console, f"configure: the playbook on {', '.join(fresh)} (bucket mount, trainer runtime)"):
        lifecycle.configure_hosts(home, console, limit=fresh)
    configure_s = time.monotonic() - t0
    t0 = time.monotonic()
    with _phase(console, f"verify: mount live and checkpoint {ckpt} reads back on {', '.join(fresh)}"):
        target = f"s3://{store.info.name}/{target_prefix}" if target_prefix is not None else rc.checkpoint.target
        for host in hosts:
            for what, location in rc.locations().items():
                guard.check_location(home, host, store, what, location)
            if host.name in fresh:
                on_vm = _verify_checkpoint_on_vm(home, host, store, target)
                if on_vm != ckpt:
                    raise GlueError(f"{host.name} sees latest valid checkpoint {on_vm}, the controller {ckpt}; "
                                    "not resuming")
    argvs = [deploy_mod.check_command(home, host, rc) for host in hosts]
    verify_s = time.monotonic() - t0
    new_n = n + 1
    record = deploy_mod.start_attempt(home, hosts, store, rc, argvs, new_n, resume=True,
                                      memory_limit_mb=attempt.get("memory_limit_mb"), group=group)
    upto = max((ckpt or 0) + verify_steps, failure_step)
    with _phase(console, f"restore + replay: waiting for attempt {new_n} to pass step {upto}"):
        new_metrics = _wait_for_steps(home, store, new_n, upto, wait_timeout)
    check = check_resume(old_metrics, new_metrics, ckpt, min(upto, failure_step), tolerance, finished_before)
    for rank in range(1, group.world_size):  # every rank must continue exactly, not just rank 0
        if not check.ok:
            break
        per_rank = check_resume(merged_metrics(store, n + 1, rank), store.metrics(rank).get(new_n, {}), ckpt,
                                min(upto, failure_step), tolerance, finished_before)
        if not per_rank.ok:
            check = ResumeCheck(False, per_rank.first_step, check.compared, f"rank {rank}: {per_rank.problem}")
    first_t = new_metrics[min(new_metrics)]["t"] if new_metrics else None
    reach_t = new_metrics.get(failure_step, {}).get("t")
    lost_s = _secs(old_metrics.get(ckpt or 0, {}).get("t"), old_metrics.get(failure_step, {}).get("t")) \
        if ckpt else _secs(attempt.get("started_at"), old_metrics.get(failure_step, {}).get("t"))
    phases = {
        "detect": _secs(last_alive, detected_at),
        "validate": round(validate_s, 3),
        "provision": round(provision_s, 3),
        "configure": round(configure_s, 3),
        "verify": round(verify_s, 3),
        "restore": _secs(record["started_at"], first_t),
        # Nothing to replay when the VM died right at its checkpoint; None = still replaying at the deadline.
        "replay": _secs(first_t, reach_t) if reach_t else (0.0 if failure_step <= (ckpt or 0) else None),
    }
    lost_node = next((nd for nd in nodes if nd["vm"] in replaced), nodes[0])
    new_host = next(h for h in hosts if h.name == lost_node["vm"])
    result = {
        "run": run_id, "failed_attempt": n, "new_attempt": new_n, "failure_class": str(outcome),
        "old_vm": {"name": lost_node["vm"], "id": lost_node["vm_id"]}, "new_vm": {"name": new_host.name,
                                                                              "id": new_host.id},
        "nodes": [{"node": k, "vm": h.name, "old_id": nd["vm_id"], "new_id": h.id, "replaced": h.name in replaced}
                  for k, (nd, h) in enumerate(zip(nodes, hosts, strict=True))],
        "world_size": group.world_size, "rendezvous": record.get("rendezvous"),
        "checkpoint_step": ckpt, "failure_step": failure_step, "seconds": phases,
        "work_lost": {"steps": failure_step - (ckpt or 0), "seconds": lost_s},
        "verified": check.ok, "first_resumed_step": check.first_step, "compared_steps": check.compared,
        "problem": check.problem, "tolerance": tolerance, "recorded_at": utc_iso(),
    }
    k = len(store.keys("recoveries/")) + 1
    store.put_json(f"recoveries/{k}.json", result)
    print_table(console, result)
    if not check.ok:
        _flag_bad_restart(home, store, manifest, new_n, check)
        raise GlueError(f"bad restart of run {run_id}: {check.problem}; the trainer was stopped and the evidence "
                        f"kept (glue incidents --run {run_id})")
    return result


def _wait_for_steps(home: Path, store: RunStore, attempt: int, upto: int, timeout: float) -> dict[int, Any]:
    deadline = time.monotonic() + timeout
    steps: dict[int, Any] = {}
    while time.monotonic() < deadline:
        steps = store.metrics().get(attempt, {})
        if steps and max(steps) >= upto:
            return steps
        exit_rec = store.get_json(f"attempts/{attempt}.exit.json")
        if exit_rec is not None:
            time.sleep(0.5)
            steps = store.metrics().get(attempt, {})
            if exit_rec.get("exit_code") != 0:
                raise GlueError(f"the resumed attempt {attempt} of run {store.run} failed (exit "
                                f"{exit_rec.get('exit_code')}, signal {exit_rec.get('signal')}); "
                                f"see `glue incidents --run {store.run}`")
            return steps
        time.sleep(0.5)
    raise GlueError(f"the resumed attempt {attempt} of run {store.run} did not reach step {upto} within "
                    f"{timeout:.0f}s; check `glue status --run {store.run}`")


def _flag_bad_restart(home: Path, store: RunStore, manifest: dict[str, Any], attempt_n: int,
                      check: ResumeCheck) -> None:
    attempt = store.attempt(attempt_n)
    _kill_attempt(home, store, attempt)
    ev = monitor.Evidence(resume_problem=check.problem, heartbeat_step=check.first_step)
    verdict = monitor.classify(ev)
    monitor.write_incident(home, store, manifest, attempt, ev, verdict)


def print_table(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"recovery of {result['run']} (attempt {result['failed_attempt']} -> "
                        f"{result['new_attempt']}, {result['failure_class']})")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    total = 0.0
    for phase, secs in result["seconds"].items():
        table.add_row(phase, "—" if secs is None else f"{secs:.1f}")
        total += secs or 0.0
    table.add_row("[bold]total[/]", f"[bold]{total:.1f}[/]")
    console.print(table)
    lost = result["work_lost"]
    console.print(f"checkpoint step {result['checkpoint_step']}, failed at step {result['failure_step']}: "
                  f"work lost {lost['steps']} steps ({lost['seconds'] or 0:.1f}s of training)")
    verdict = "[green]verified[/]" if result["verified"] else f"[red]NOT verified[/]: {result['problem']}"
    if result["verified"] and result["first_resumed_step"] is None:
        console.print(f"resume {verdict}: the lost attempt had finished training (checkpoint "
                      f"{result['checkpoint_step']} is its last step, its outputs are in the bucket); "
                      "the new attempt had nothing to replay")
        return
    console.print(f"resume {verdict}: first resumed step {result['first_resumed_step']}, losses equal at steps "
                  f"{_ranges(result['compared_steps'])}")


def _ranges(steps: list[int]) -> str:
    if not steps:
        return "none (no overlapping steps)"
    return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])



"""`glue deploy`: preflight everything, then record the run and start its trainer on a VM.

Nothing is written to the bucket and nothing starts until every check has passed: the config is
valid, the run id is new (or --resume), the bucket answers, every durable location is in the
bucket (the boundary guard), the command or image exists on the VM, every secret is set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.paths import PROJECT_ROOT
from glue.runs import config as runconfig
from glue.runs import docker_run, gate, guard, lease, monitor, remote, serverless, workspace
from glue.runs import vm_group as group_mod
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, utc_iso
from glue.runs.vm_group import GroupSpec, Rendezvous
from glue.storage import bucket as bucket_store
from glue.workdir import plan as wplan
from glue.workdir.pin import Workspace


def code_version() -> dict[str, Any]:
    """git sha + dirty flag of the project deploying the run."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return {"git_sha": sha, "dirty": bool(status) if status is not None else None}


def refuse_live_or_done(home: Path, store: RunStore) -> None:
    """--resume starts a new attempt from the last checkpoint: never beside a trainer that still runs (two
    would write the same checkpoints) or over a completed run (its outputs are final)."""
    if not store.attempts():
        return  # a manifest whose first start failed (a group's rendezvous): nothing runs, nothing finished
    verdict = monitor.check(home, store).diagnosis
    if verdict.outcome is AttemptClass.RUNNING:
        raise GlueError(f"run {store.run} is still running ({verdict.reason}): a second trainer would write the "
                        f"same checkpoints. Wait for it to end; if it hangs, `glue recover --run {store.run}` "
                        "classifies and replaces it")
    if verdict.outcome is AttemptClass.COMPLETED:
        raise GlueError(f"run {store.run} completed; its outputs are final. Deploy a new run id to train again")


def check_command(home: Path, host: Host, rc: runconfig.RunConfig, ws: Workspace | None = None) -> list[str]:
    """The argv to run on the VM; refuse when its program or module is not there. A program in the run's
    workdir package was checked against the package at deploy; a module may also come from the run's
    requirements (installed only when the attempt is prepared)."""
    if rc.runtime == "docker":
        assert rc.image is not None
        res = ssh.run(home, host, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(rc.image)}", timeout=60)
        if res.exit_code != 0:
            raise GlueError(f"image {rc.image} is not on {host.name} (docker image inspect failed); set the trainer "
                            f"role's trainer_image: {rc.image} (trainer_image_source: pull, or build: offline from the "
                            "VM's own root filesystem, images/trainer/Dockerfile.offline) and run `glue up`")
        return list(rc.command)
    argv = list(rc.command)
    if argv[0] in ("python", "python3"):
        argv[0] = remote.python(host)
    if ws is not None and ws.command_in_package:
        return argv
    if len(argv) >= 3 and argv[0].endswith("python") and argv[1] == "-m":
        if ws is not None and ws.requirements and ws.requirements.get("pins"):
            return argv
        module = argv[2]
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        probe = f"{shlex.quote(argv[0])} -c {shlex.quote(code)}"
        if ssh.run(home, host, probe, timeout=60).exit_code != 0:
            raise GlueError(f"command module {module!r} is not importable on {host.name} with {argv[0]}")
        return argv
    if ssh.run(home, host, f"command -v {shlex.quote(argv[0])}", timeout=20).exit_code != 0:
        raise GlueError(f"command {argv[0]!r} not found on {host.name}")
    return argv


def check_eval_set(store: RunStore, rc: runconfig.RunConfig) -> dict[str, Any] | None:
    """The pinned evaluation set: it must be in the run's bucket with exactly the sha256 run.yaml pins.
    Returns the pin for the manifest (uri, sha256, size); None when run.yaml names no evaluation set."""
    ds = rc.evaluation.dataset if rc.evaluation else None
    if ds is None:
        return None
    key = monitor.as_s3_prefix(ds.uri, store.info.name)
    if not key:
        raise GlueError(f"evaluation.dataset.uri {ds.uri} is not an object in the run's bucket: use "
                        f"s3://{store.info.name}/<key> (or a path under /mnt/s3)")
    data = _read_object(store, key)
    if data is None:
        raise GlueError(f"evaluation set {ds.uri} is not in bucket {store.info.name}; upload it, or fix "
                        "evaluation.dataset.uri in run.yaml")
    digest = hashlib.sha256(data).hexdigest()
    if digest != ds.sha256:
        raise GlueError(f"evaluation set {ds.uri} has sha256 {digest}, but run.yaml pins {ds.sha256}: the set "
                        "changed; runs judged on different sets cannot be compared (pin the new hash on purpose)")
    return {"uri": ds.uri, "sha256": digest, "size": len(data)}


def _read_object(store: RunStore, key: str) -> bytes | None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return bucket_store.read(store.s3, store.info.name, key)
    except (ClientError, BotoCoreError) as exc:
        raise GlueError(f"bucket {store.info.name} did not answer (get {key}): {str(exc).splitlines()[0]}") from exc


def scale_gate(store: RunStore, nodes: int, require_validated: bool, console: Console,
               workdir_sha256: str | None = None) -> None:
    """--nodes N > 1: a smaller run of the same code (the same workdir package, else gpukit's commit) must
    have met its acceptance criteria and a drill of it passed; otherwise warn, or refuse with
    --require-validated."""
    if nodes <= 1:
        return
    sha = code_version().get("git_sha")
    found = gate.validation(store.info, store.creds, sha, nodes, workdir_sha256)
    code = f"workdir {workdir_sha256[:12]}" if workdir_sha256 else f"commit {str(sha)[:12]}"
    if found.ok:
        console.print(f"scale gate: validated by run {found.accepted_run} (acceptance) and drill "
                      f"{found.passed_drill} of {code}")
        return
    what = f"--nodes {nodes} for unvalidated code ({code}): {found.missing()}"
    if require_validated:
        raise GlueError(f"scale gate: refusing {what}; validate a smaller run first, or drop --require-validated")
    console.print(f"[yellow]scale gate: warning: {what}[/]")


def _image_digest(home: Path, host: Host, image: str | None) -> str | None:
    if not image:
        return None
    res = ssh.run(home, host, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}", timeout=60)
    return res.stdout.strip() or None


def deploy(home: Path, run_id: str, config_path: Path, vm: str | None, resume: bool, console: Console,
           memory_limit_mb: int | None = None, config_overrides: dict[str, Any] | None = None,
           group: GroupSpec | None = None, env_overrides: dict[str, str] | None = None,
           require_validated: bool = False, workdir: Path | None = None,
           pinned: Workspace | None = None) -> dict[str, Any]:
    """Preflight, record, start. Returns the attempt record. `workdir` overrides run.yaml's; `pinned` (a
    drill of an existing run) ships that run's code and requirements instead of packing a folder."""
    group = group or GroupSpec()
    group.check()
    runconfig.check_run_id(run_id)
    if runconfig.runtime_of(config_path) == serverless.RUNTIME:  # its records live in Lyceum's bucket
        serverless.use_lyceum_bucket(home)
    store = RunStore.open(home, run_id)
    rc = runconfig.load(config_path, run_id, store.info.name)
    if config_overrides:
        rc = rc.with_config(config_overrides)
    if env_overrides:
        rc = rc.model_copy(update={"env": {**rc.env, **env_overrides}})
    if rc.runtime == serverless.RUNTIME:  # a Lyceum execution per attempt: no VM, no workdir to pack
        if group.distributed or vm or memory_limit_mb or pinned is not None:
            raise GlueError("runtime lyceum-run runs one execution per attempt: --vm, --nodes, --procs-per-node, "
                            "--memory-limit-mb and drills do not apply")
        exists = store.exists()
        if resume and exists:
            refuse_live_or_done(home, store)
        return serverless.deploy(home, store, rc, resume, console, check_eval_set(store, rc) if not exists else None)
    if group.distributed and rc.runtime == "docker":
        raise GlueError("--nodes/--procs-per-node need `runtime: process` (torchrun on the VM); "
                        "a docker trainer runs on one VM")
    # The user's folder is read only for a new run, and checked before any VM work; a resumed run
    # (and a drill of one) brings back what its manifest pins.
    plan = wplan.make(rc, config_path, workdir) if not resume and pinned is None else wplan.Plan()
    try:
        return _deploy(home, store, rc, vm, resume, console, memory_limit_mb, group, require_validated, plan, pinned)
    finally:
        plan.close()


def _deploy(home: Path, store: RunStore, rc: runconfig.RunConfig, vm: str | None, resume: bool, console: Console,
            memory_limit_mb: int | None, group: GroupSpec, require_validated: bool, plan: wplan.Plan,
            pinned: Workspace | None) -> dict[str, Any]:
    run_id = store.run
    hosts = group_mod.pick_hosts(home, vm, group.nodes)
    exists = store.exists()  # also: the bucket answers
    if exists and not resume:
        raise GlueError(f"run {run_id!r} already exists in the bucket; pick a new run id, or add --resume to start "
                        "a new attempt that resumes it")
    if resume and not exists:
        raise GlueError(f"cannot resume run {run_id!r}: it does not exist in the bucket; deploy it without --resume")
    if resume:
        refuse_live_or_done(home, store)
        pinned = Workspace.from_manifest(store.manifest())
    if not resume:
        shipped = plan.package.sha256 if plan.package else (pinned.package or {}).get("sha256") if pinned else None
        scale_gate(store, group.nodes, require_validated, console, shipped)
    eval_pin = check_eval_set(store, rc) if not exists else None
    for host in hosts:
        if not ssh.reachable(home, host):
            raise GlueError(f"{host.name} does not answer SSH; check `glue status`")
    # The trainer environment's report (its python imports torch: a second or more) comes in while the
    # rest of the preflight runs and the lease settles; it goes into the manifest written under the lease.
    with ThreadPoolExecutor(max_workers=1) as pool:
        info = pool.submit(remote.env_info, home, hosts[0])
        return _preflight_and_start(home, store, rc, hosts, resume, console, memory_limit_mb, group, plan,
                                    pinned, exists, eval_pin, info)


def _preflight_and_start(home: Path, store: RunStore, rc: runconfig.RunConfig, hosts: list[Host], resume: bool,
                         console: Console, memory_limit_mb: int | None, group: GroupSpec, plan: wplan.Plan,
                         pinned: Workspace | None, exists: bool, eval_pin: dict[str, Any] | None,
                         info: Future[dict[str, Any]]) -> dict[str, Any]:
    names = ", ".join(h.name for h in hosts)
    checked = pinned or Workspace(package={"command_in_package": plan.command_in_package} if plan.package else None,
                                  requirements={"pins": plan.requirements} if plan.requirements else None)
    with console.status(f"preflight on {names}: boundary guard, command, environment"):
        argvs = []
        for host in hosts:
            for what, location in rc.locations().items():
                guard.check_location(home, host, store, what, location)
            argvs.append(check_command(home, host, rc, checked))
        missing = [s for s in rc.secrets if s not in os.environ]
        if missing:
            raise GlueError(f"secret {missing[0]} is not set in your environment; export it (its value is handed "
                            "to the trainer in a 0600 file, never stored)")
        digest = _image_digest(home, hosts[0], rc.image)
        rdzv = group_mod.rendezvous(home, hosts, [remote.python(h) for h in hosts]) if group.distributed else None
    ws = pinned if pinned is not None else workspace.ship(home, hosts[0], store, plan, console)
    with lease.held(store, "deploy", new_run=not exists):
        return _record_and_start(home, store, rc, hosts, argvs, resume, info.result(), digest, group, rdzv,
                                 memory_limit_mb, console, eval_pin, ws)


def _record_and_start(home: Path, store: RunStore, rc: runconfig.RunConfig, hosts: list[Host],
                      argvs: list[list[str]], resume: bool, env_info: dict[str, Any], digest: str | None,
                      group: GroupSpec, rdzv: Rendezvous | None, memory_limit_mb: int | None,
                      console: Console, eval_pin: dict[str, Any] | None = None,
                      ws: Workspace | None = None) -> dict[str, Any]:
    """Under the run's lease: check again that the run is (or is not) there, write the manifest, start."""
    run_id = store.run
    exists = store.exists()
    if exists and not resume:
        raise GlueError(f"run {run_id!r} already exists in the bucket (another deploy just created it)")
    attempts = store.attempts()
    attempt = (max(attempts) + 1) if attempts else 1
    names = ", ".join(h.name for h in hosts)
    if not exists:
        store.put_manifest({
            "run": run_id, "created_at": utc_iso(), "image": rc.image, "image_digest": digest,
            "command": list(rc.command), "runtime": rc.runtime, "config": rc.as_dict(),
            "input": rc.input.model_dump() if rc.input else None, "code": code_version(),
            "environment": {**env_info, "gpu_type": hosts[0].gpu_type, "gpu_count": hosts[0].gpu_count,
                            "backend": hosts[0].backend, "market": hosts[0].market},
            "distributed": group.as_dict() if group.distributed else None,
            "secrets": list(rc.secrets), "outputs": {"destination": rc.outputs.destination,
                                                     "required": list(rc.outputs.required)},
            "checkpoint": rc.checkpoint.model_dump(), "bucket": {"endpoint": store.info.endpoint,
                                                            "name": store.info.name},
            # The evaluation set as verified at deploy (its sha256 pinned): runs judged on different sets
            # are refused by `glue compare`.
            "evaluation": {"dataset": eval_pin,
                           "metrics": rc.evaluation.model_dump()["metrics"] if rc.evaluation else {}},
            # The user's code and resolved requirements by content hash: every later attempt (recovery,
            # glue watch, another node) brings back exactly these, from the bucket.
            "workdir": ws.package if ws else None, "requirements": ws.requirements if ws else None,
        })
    record = start_attempt(home, hosts, store, rc, argvs, attempt, resume=resume or attempt > 1,
                           memory_limit_mb=memory_limit_mb, group=group, rdzv=rdzv, ws=ws)
    where = f"{group.nodes} nodes ({names}) x {group.procs_per_node} processes, rendezvous " \
            f"{record['rendezvous']}" if group.distributed else hosts[0].name
    console.print(f"[green]run {run_id}[/] attempt {attempt} started on {where} "
                  f"(trainer pid {record.get('trainer_pid')})")
    return record


def prepare_nodes(home: Path, hosts: list[Host], store: RunStore, ws: Workspace,
                  attempt: int) -> list[dict[str, Any] | None]:
    """Each node gets the bucket credentials and, for a run with a workdir or requirements, its code and
    virtualenv for `attempt`, from the bucket by the manifest's hashes. Starts nothing: a node that
    cannot (a package that does not match its hash) refuses before any attempt is recorded."""
    ready: list[dict[str, Any] | None] = []
    for host in hosts:
        workspace.push_credentials(home, host, store)
        ready.append(workspace.prepare(home, host, store, ws, attempt) if ws.needs_prepare else None)
    return ready


def start_attempt(home: Path, hosts: list[Host], store: RunStore, rc: runconfig.RunConfig, argvs: list[list[str]],
                  attempt: int, resume: bool, memory_limit_mb: int | None = None,
                  group: GroupSpec | None = None, rdzv: Rendezvous | None = None,
                  ws: Workspace | None = None, ready: list[dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """Hand credentials and the launch spec to each VM (0600, tmpfs) and start its supervisor detached.

    One supervisor per node; with a distributed group each runs the command under torchrun (at `rdzv`,
    probed here when not given). A run with a workdir or requirements (`ws`) has them prepared on each
    node first (`prepare_nodes`, unless the caller did: `ready`).
    """
    group = group or GroupSpec()
    ws = ws or Workspace()
    if ready is None:
        ready = prepare_nodes(home, hosts, store, ws, attempt)
    sdir = remote.state_dir(store.run)
    env = {
        **rc.env,
        **{name: os.environ[name] for name in rc.secrets},
        "GPUKIT_RUN": store.run, "GPUKIT_ATTEMPT": str(attempt), "GPUKIT_RESUME": "1" if resume else "0",
        "GPUKIT_CONFIG": json.dumps(rc.config), "GPUKIT_CHECKPOINT": rc.checkpoint.target,
        "GPUKIT_CHECKPOINT_INTERVAL": str(rc.checkpoint.interval_steps),
        "GPUKIT_KEEP_LAST": str(rc.checkpoint.keep_last), "GPUKIT_OUTPUTS": rc.outputs.destination,
        "GPUKIT_HEARTBEAT_SECONDS": str(rc.monitor.heartbeat_seconds), "GPUKIT_SCRATCH": remote.SCRATCH,
        "GPUKIT_BUCKET_ENDPOINT": store.info.endpoint, "GPUKIT_BUCKET_NAME": store.info.name,
        "GPUKIT_BUCKET_REGION": store.info.region if store.info.region != "local" else "us-east-1",
        "GPUKIT_CREDENTIALS_FILE": remote.CREDENTIALS_PATH, "PYTHONUNBUFFERED": "1",
    }
    ds = rc.evaluation.dataset if rc.evaluation else None
    if ds is not None:  # glue.train.run.evaluation.load_eval_set reads it, through the S3 API, and checks the pin
        key = monitor.as_s3_prefix(ds.uri, store.info.name)
        env.update(GPUKIT_EVAL_URI=f"s3://{store.info.name}/{key}", GPUKIT_EVAL_SHA256=ds.sha256)
    if group.distributed and rdzv is None:
        rdzv = group_mod.rendezvous(home, hosts, [remote.python(h) for h in hosts])
    record: dict[str, Any] = {
        "run": store.run, "attempt": attempt, "vm": hosts[0].name, "vm_id": hosts[0].id,
        "backend": hosts[0].backend, "started_at": utc_iso(), "resume": resume, "memory_limit_mb": memory_limit_mb,
        "ended_at": None, "exit": None, "failure_class": None, "last_step": None,
        "nodes": [{"node": k, "vm": h.name, "vm_id": h.id} for k, h in enumerate(hosts)],
        "rendezvous": rdzv.endpoint if rdzv else None,
    }
    store.put_attempt(record)
    docker = rc.runtime == "docker"
    for k, host in enumerate(hosts):
        node_ready = ready[k]
        if node_ready:
            record["nodes"][k].update(code_sha256=node_ready["package_sha256"],
                                      requirements_set=node_ready["requirements_set"])
        argv, node_env, cwd = workspace.launch(argvs[k], remote.python(host), env, node_ready, docker)
        if rdzv is not None:
            argv = group_mod.torchrun_argv(argv[0] if node_ready else remote.python(host), argv, group, rdzv, k,
                                           store.run, attempt)
        # The interface gloo/nccl bind to comes first: a user's own setting in run.yaml `env` wins.
        node_env = {**(group_mod.node_env(rdzv, k) if rdzv is not None else {}), **node_env,
                    "GPUKIT_NODE": str(k), "GPUKIT_VM": host.name}
        if docker:
            gpus = docker_run.docker_gpus(home, host)
            record["nodes"][k]["docker_gpus"] = gpus
            argv = docker_run.docker_argv(store.run, attempt, str(rc.image), argv, f"{sdir}/attempt-{attempt}.env",
                                          gpus=gpus, code_dir=cwd)
            ssh.put_file(home, host, f"{sdir}/attempt-{attempt}.env",
                         "".join(f"{k}={v}\n" for k, v in node_env.items()).encode())
        spec = {"run": store.run, "attempt": attempt, "node": k, "command": argv, "env": node_env,
                "memory_limit_mb": memory_limit_mb, "credentials_file": remote.CREDENTIALS_PATH,
                "cwd": (cwd if cwd and not docker else remote.SCRATCH),
                "bucket": {"endpoint": store.info.endpoint, "name": store.info.name,
                           "region": env["GPUKIT_BUCKET_REGION"]}}
        spec_path = f"{sdir}/attempt-{attempt}.json"
        ssh.put_file(home, host, spec_path, json.dumps(spec).encode())
        py = shlex.quote(remote.python(host))
        # Only the supervisor goes to the background, its output redirected: a backgrounded `a && b && c &`
        # would be a subshell holding the SSH session's pipes until the supervisor exits (the command
        # then returned only at ssh.run's 2 s end-of-output deadline).
        start = (f"mkdir -p {remote.SCRATCH} && cd {remote.SCRATCH} && {{ setsid {py} -m glue.train.run.supervise "
                 f"{shlex.quote(spec_path)} </dev/null >{sdir}/supervisor-{attempt}.log 2>&1 & }}")
        res = ssh.run(home, host, start, timeout=30)
        if res.exit_code != 0:
            raise GlueError(f"{host.name}: could not start the trainer: {res.stderr.strip()}")
    for k, host in enumerate(hosts):
        record["nodes"][k].update(_wait_started(home, host, store.run, attempt))
    record.update({key: record["nodes"][0][key] for key in ("supervisor_pid", "trainer_pid", "started_at",
                                                            "code_sha256", "requirements_set")
                   if key in record["nodes"][0]})
    store.put_attempt(record)
    return record


# The supervisor's Python start: a second on a real VM; on an emulated one (qemu without KVM) under load
# its imports alone took 40 s.
SUPERVISOR_START_S = 180


def _wait_started(home: Path, host: Host, run: str, attempt: int) -> dict[str, Any]:
    deadline = time.monotonic() + SUPERVISOR_START_S
    while time.monotonic() < deadline:
        state = remote.process_state(home, host, run, attempt)
        if state["pids"]:
            return dict(state["pids"])
        time.sleep(0.2)
    raise GlueError(f"{host.name}: the trainer's supervisor did not start within {SUPERVISOR_START_S}s "
                    f"(see {remote.state_dir(run)}/supervisor-{attempt}.log on the VM)")

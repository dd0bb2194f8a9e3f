"""`glue deploy`: preflight everything, then record the run and start its trainer on a VM.

Nothing is written to the bucket and nothing starts until every check has passed: the config is
valid, the run id is new (or --resume), the bucket answers, every durable location is in the
bucket (the boundary guard), the command or image exists on the VM, every secret is set.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.paths import PROJECT_ROOT
from glue.runs import attempt as attempt_mod
from glue.runs import config as runconfig
from glue.runs import gate, guard, lease, monitor, remote, serverless, workspace
from glue.runs import vm_group as group_mod
from glue.runs.classify import AttemptClass
from glue.runs.records import Manifest
from glue.runs.store import RunStore
from glue.runs.vm_group import GroupSpec
from glue.shell_secrets import from_shell
from glue.storage import bucket as bucket_store
from glue.train.layout import env_pack_index_key
from glue.train.run.torchrun import Rendezvous
from glue.workdir import plan as wplan
from glue.workdir.pin import Workspace


def git_version() -> dict[str, Any]:
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


def check_eval_set(store: RunStore, rc: runconfig.RunConfig) -> dict[str, Any] | None:
    """The pinned evaluation set: it must be in the run's bucket with exactly the sha256 run.yaml pins.
    Returns the pin for the manifest (uri, sha256, size); None when run.yaml names no evaluation set."""
    ds = rc.evaluation.dataset if rc.evaluation else None
    if ds is None:
        return None
    key = bucket_store.as_s3_prefix(ds.uri, store.info.name)
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
    sha = git_version().get("git_sha")
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


def deploy(home: Path, run_id: str, config_path: Path, vm: str | None, resume: bool, console: Console, *,
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
        return Deployment(home, store, rc, console, resume, group, plan, memory_limit_mb, require_validated,
                          pinned).run(vm)
    finally:
        plan.close()


@dataclass
class Deployment:
    """`glue deploy` of a run onto VMs of the cluster, as named steps: pick the hosts, check the run, the
    preflight on each host, ship the workspace, then under the run's lease record the manifest and start
    attempt 1 (or the next, with --resume) through glue.runs.attempt."""

    home: Path
    store: RunStore
    rc: runconfig.RunConfig
    console: Console
    resume: bool
    group: GroupSpec
    plan: wplan.Plan
    memory_limit_mb: int | None = None
    require_validated: bool = False
    pinned: Workspace | None = None  # what the manifest pins: a drill's code, or the run's own on --resume
    hosts: list[Host] = field(default_factory=list)
    exists: bool = False
    eval_pin: dict[str, Any] | None = None
    shared: str = ""  # the busy VMs --vm chose, and their live runs: said when the run starts

    def run(self, vm: str | None) -> dict[str, Any]:
        self._check_run()
        placed = group_mod.pick_hosts(self.home, vm, self.group.nodes, self.store.run)
        self.hosts, self.shared = placed.hosts, placed.shared
        for host in self.hosts:
            if not ssh.reachable(self.home, host):
                raise GlueError(f"{host.name} does not answer SSH; check `glue status`")
        # The trainer environment's report (its python imports torch: a second or more) comes in while the
        # rest of the preflight runs and the lease settles; it goes into the manifest written under the lease.
        with ThreadPoolExecutor(max_workers=1) as pool:
            info = pool.submit(remote.env_info, self.home, self.hosts[0])
            argvs, digest, rdzv = self._preflight()
            ws = self.pinned if self.pinned is not None else \
                workspace.ship(self.home, self.hosts[0], self.store, self.plan, self.console)
            with lease.held(self.store, "deploy", new_run=not self.exists):
                return self._record_and_start(argvs, ws, rdzv, info, digest)

    def _check_run(self) -> None:
        """The run id is new (or exists, with --resume, and is neither running nor done); the scale gate;
        the evaluation set's pin."""
        run_id, store = self.store.run, self.store
        self.exists = store.exists()  # also: the bucket answers
        if self.exists and not self.resume:
            raise GlueError(f"run {run_id!r} already exists in the bucket; pick a new run id, or add --resume to "
                            "start a new attempt that resumes it")
        if self.resume and not self.exists:
            raise GlueError(f"cannot resume run {run_id!r}: it does not exist in the bucket; deploy it without "
                            "--resume")
        if self.resume:
            refuse_live_or_done(self.home, store)
            self.pinned = Workspace.from_manifest(store.read_manifest())
        else:
            pinned = self.pinned
            shipped = self.plan.package.sha256 if self.plan.package else \
                (pinned.package or {}).get("sha256") if pinned else None
            scale_gate(store, self.group.nodes, self.require_validated, self.console, shipped)
        self.eval_pin = check_eval_set(store, self.rc) if not self.exists else None

    def _preflight(self) -> tuple[list[list[str]], str | None, Rendezvous | None]:
        """On each host: the boundary guard, the command; every secret set; the image's digest; the
        rendezvous of a distributed group."""
        plan, rc = self.plan, self.rc
        checked = self.pinned or Workspace(
            package={"command_in_package": plan.command_in_package} if plan.package else None,
            requirements={"pins": plan.requirements} if plan.requirements else None)
        names = ", ".join(h.name for h in self.hosts)
        with self.console.status(f"preflight on {names}: boundary guard, command, environment"):
            argvs = []
            for host in self.hosts:
                for what, location in rc.locations().items():
                    guard.check_location(self.home, host, self.store, what, location)
                argvs.append(attempt_mod.check_command(self.home, host, rc, checked))
            from_shell(rc.secrets, "deploy again")
            digest = _image_digest(self.home, self.hosts[0], rc.image)
            rdzv = group_mod.rendezvous(self.home, self.hosts, [remote.python(h) for h in self.hosts]) \
                if self.group.distributed else None
        return argvs, digest, rdzv

    def _pin_pack(self, manifest: Manifest) -> None:
        """The pack of the run's set that its first attempt used (packed or found) into the manifest: a later
        VM refuses another one put in its place (glue.train.workspace.environment)."""
        req = manifest.requirements
        if not (req and req.get("pins")):
            return
        index = bucket_store.read_json(self.store.s3, self.store.info.name, env_pack_index_key(str(req["set_sha256"])))
        if isinstance(index, dict) and index.get("sha256"):
            manifest.requirements = {**req, "pack_sha256": str(index["sha256"])}
            self.store.put_manifest(manifest)

    def _record_and_start(self, argvs: list[list[str]], ws: Workspace, rdzv: Rendezvous | None,
                          info: Future[dict[str, Any]], digest: str | None) -> dict[str, Any]:
        """Under the run's lease: check again that the run is (or is not) there, write the manifest, start."""
        store, hosts = self.store, self.hosts
        env_info = info.result()  # a trainer runtime that does not start refuses here, before anything is written
        exists = store.exists()
        if exists and not self.resume:
            raise GlueError(f"run {store.run!r} already exists in the bucket (another deploy just created it)")
        attempts = store.attempts()
        number = (max(attempts) + 1) if attempts else 1
        manifest: Manifest | None = None  # written now: a new run
        if not exists:
            head = hosts[0]
            environment = {**env_info, "gpu_type": head.gpu_type, "gpu_count": head.gpu_count,
                           "backend": head.backend, "market": head.market}
            manifest = Manifest.of_run(
                store, self.rc, environment, self.eval_pin, image_digest=digest, code=git_version(),
                distributed=self.group.as_dict() if self.group.distributed else None,
                workdir=ws.package, requirements=ws.requirements)
            store.put_manifest(manifest)
        record = attempt_mod.Attempt(self.home, store, self.rc, hosts, number, resume=self.resume or number > 1,
                                     memory_limit_mb=self.memory_limit_mb, group=self.group, ws=ws,
                                     rdzv=rdzv).start(argvs)
        if manifest is not None:
            self._pin_pack(manifest)
        names = ", ".join(h.name for h in hosts)
        where = f"{self.group.nodes} nodes ({names}) x {self.group.procs_per_node} processes, rendezvous " \
                f"{record.rendezvous}" if self.group.distributed else hosts[0].name
        self.console.print(f"[green]run {store.run}[/] attempt {number} started on {where} "
                           f"(trainer pid {record.trainer_pid})")
        if self.shared:
            self.console.print(f"[yellow]sharing on purpose (--vm): live runs already use {self.shared}; the runs "
                               "compete for its CPUs, memory and GPUs[/]")
        return record.to_dict()

"""`glue deploy` on a Slurm cluster: the same preflight and the same records as a deploy onto a VM, then
the run submitted as a batch job on the head (sbatch --parsable) instead of started on a VM.

Checked before anything is written to the bucket: slurmctld answers, the run's `resources:` fit a node
(GPUs per node, nodes), the run id is new, the command and every secret are there. The workdir and
requirements ship to the bucket as for any run; the manifest records the job (`scheduler`: job id, sbatch
options); every (re)start of the job records its own attempt on its node (glue.train.run.slurm_job).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import config as runconfig
from glue.runs import lease, remote, trainer_env, workspace
from glue.runs.deploy import Deployment, git_version
from glue.runs.records import Manifest
from glue.runs.store import RunStore, utc_iso
from glue.runs.vm_group import GroupSpec
from glue.scheduler.slurm import SPARE_REASON, queue
from glue.scheduler.slurm.batch import BatchScript, SbatchOptions, gpus_of
from glue.scheduler.slurm.nodes import NodeState, head, node_states
from glue.shell_secrets import from_shell
from glue.train import trainer_vars as V
from glue.train.run.launch import SpecBucket
from glue.train.run.slurm_job import SlurmJobSpec
from glue.train.state_paths import StatePaths
from glue.train.storage.credentials import credentials_doc
from glue.workdir import plan as wplan
from glue.workdir.pin import Workspace


def check_fits(options: SbatchOptions, states: list[NodeState]) -> None:
    """One line when no node (or too few) could ever run the job: it would pend forever."""
    if not states:
        raise GlueError("the Slurm cluster has no nodes; run `glue up --scheduler slurm`")
    most = max(gpus_of(n.gres) for n in states)
    if options.gpus_per_node > most:
        raise GlueError(f"resources.gpus_per_node is {options.gpus_per_node}, but no node of the Slurm cluster has "
                        f"more than {most} GPU(s) ({', '.join(f'{n.name} {gpus_of(n.gres)}' for n in states)}): "
                        f"ask for at most {most}, or add bigger VMs")
    able = [n.name for n in states if gpus_of(n.gres) >= options.gpus_per_node and n.reason != SPARE_REASON]
    if options.nodes > len(able):
        raise GlueError(f"resources.nodes is {options.nodes}, but the Slurm cluster has {len(able)} node(s) with "
                        f"{options.gpus_per_node} GPU(s) outside the spares ({', '.join(able) or 'none'}): ask for "
                        f"at most {len(able)}, or `glue up --vms {options.nodes}` for more nodes")


def refuse_flags(resume: bool, vm: str | None, group: GroupSpec) -> None:
    """What a VM deploy takes but Slurm decides: placement, groups, new attempts."""
    if resume:
        raise GlueError("--resume: on a Slurm cluster the job continues itself (requeued after a notice or a lost "
                        "node, resumed from the newest valid checkpoint); deploy a new run id to train again")
    if vm:
        raise GlueError("--vm: on a Slurm cluster Slurm places the run; drop --vm (run.yaml's `resources:` says "
                        "how many GPUs it needs)")
    if group.distributed:
        raise GlueError("--nodes/--procs-per-node: on a Slurm cluster put them in run.yaml as "
                        "`resources: {nodes: N, gpus_per_node: G}`")


def deploy(home: Path, run_id: str, config_path: Path, console: Console, *, resume: bool = False,
           vm: str | None = None, group: GroupSpec | None = None, memory_limit_mb: int | None = None,
           workdir: Path | None = None) -> dict[str, Any]:
    """Preflight, ship, submit. Returns the run's `scheduler` record (job id, options)."""
    group = group or GroupSpec()
    group.check()
    refuse_flags(resume, vm, group)
    runconfig.check_run_id(run_id)
    store = RunStore.open(home, run_id)
    rc = runconfig.load(config_path, run_id, store.info.name)
    if rc.runtime != "process":
        raise GlueError(f"runtime {rc.runtime}: a Slurm cluster runs `runtime: process` runs (the command on the "
                        "allocated node)")
    plan = wplan.make(rc, config_path, workdir)
    try:
        return SlurmDeployment(home, store, rc, console, False, group, plan, memory_limit_mb).submit()
    finally:
        plan.close()


class SlurmDeployment(Deployment):
    """Deployment's checks and shipping, on the head (every node runs the same image); then sbatch."""

    def submit(self) -> dict[str, Any]:
        host = head(self.home)
        options = SbatchOptions.of(self.store.run, self.rc.resources)
        check_fits(options, node_states(self.home))  # also: slurmctld answers
        self._check_run()
        self.hosts = [host]
        if not ssh.reachable(self.home, host):
            raise GlueError(f"the Slurm head {host.name} does not answer SSH; check `glue status`")
        info = remote.env_info(self.home, host)
        argvs, digest, _ = self._preflight()
        ws = workspace.ship(self.home, host, self.store, self.plan, self.console)
        with lease.held(self.store, "deploy", new_run=True):
            if self.store.exists():
                raise GlueError(f"run {self.store.run!r} already exists in the bucket (another deploy just created it)")
            spec = self.job_spec(host, argvs[0], ws)
            script = BatchScript(self.store.run, options, remote.python(host)).render()
            job_id = submit_job(self.home, host, self.store.run, spec, script)
            sched = {"name": "slurm", "job_id": job_id, "submitted_at": utc_iso(), "sbatch": options.args(),
                     "head_vm_id": host.id}
            environment = {**info, "gpu_type": host.gpu_type, "gpu_count": options.gpus_per_node,
                           "backend": host.backend, "market": host.market}
            manifest = Manifest.of_run(self.store, self.rc, environment, self.eval_pin, image_digest=digest,
                                       code=git_version(), workdir=ws.package, requirements=ws.requirements)
            manifest.scheduler = sched
            try:
                self.store.put_manifest(manifest)
            except GlueError:
                queue.cancel(self.home, job_id, self.store.run)  # no job runs for a run the bucket does not know
                raise
        self.console.print(f"[green]run {self.store.run}[/] submitted to Slurm as job {job_id} "
                           f"({options.gpus_per_node} GPU(s) per node); `glue status` shows the queue")
        return sched

    def job_spec(self, host: Host, argv: list[str], ws: Workspace) -> SlurmJobSpec:
        return job_spec(self.home, self.store, self.rc, host, argv, ws, memory_limit_mb=self.memory_limit_mb)


def job_spec(home: Path, store: RunStore, rc: runconfig.RunConfig, host: Host, argv: list[str], ws: Workspace, *,
             memory_limit_mb: int | None = None, first_attempt: int = 1, resume: bool = False) -> SlurmJobSpec:
    """What every start of the run's job needs: its command, environment (run.yaml's env, the secrets from
    this shell, the trainer's), the bucket and its keys, the workspace to prepare. A resubmission (the head
    lost with its queue) starts at the run's next attempt, resumed."""
    env = {**rc.env, **from_shell(rc.secrets, f"submit run {store.run} again"),
           **trainer_env.for_vm(store, rc, first_attempt, resume).to_env(), "PYTHONUNBUFFERED": "1"}
    prep = {k: v for k, v in ws.prepare_spec(store.run, first_attempt).items() if k != "attempt"} \
        if ws.needs_prepare else None
    info = store.info
    return SlurmJobSpec(
        run=store.run, first_attempt=first_attempt, resume=resume, command=argv, env=env,
        bucket=SpecBucket(name=info.name, endpoint=info.endpoint, region=info.signing_region),
        credentials_file=remote.CREDENTIALS_PATH, credentials=credentials_doc(store.creds).decode(),
        image_python=remote.python(host), scratch=remote.SCRATCH, backend=host.backend,
        vm_ids={h.name: h.id for h in current.hosts(home)}, workspace=prep, memory_limit_mb=memory_limit_mb,
        nodes=rc.resources.nodes if rc.resources else 1,
        procs_per_node=rc.resources.gpus_per_node if rc.resources else 1)


def submit_job(home: Path, host: Host, run: str, spec: SlurmJobSpec, script: str) -> str:
    """sbatch --parsable on the head. The spec (secrets, bucket keys) goes to a 0600 file on the head's tmpfs
    and from there into sbatch's environment (slurmctld keeps it with the job), never into an argument; the
    file is removed once sbatch has read it. Returns the job id."""
    folder = StatePaths.of(run, 0).folder
    spec_path, script_path = f"{folder}/slurm-submit.json", f"{folder}/slurm-job.sh"
    ssh.put_file(home, host, spec_path, spec.to_json().encode())
    ssh.put_file(home, host, script_path, script.encode())
    sp, sc = shlex.quote(spec_path), shlex.quote(script_path)
    command = (f"cd /tmp && {V.SLURM_SPEC}=\"$(cat {sp})\" timeout {queue.TIMEOUT_S} sbatch --parsable {sc}; "
               f"rc=$?; rm -f {sp}; exit $rc")
    return queue.parse_job_id(queue.on_head(home, command, "sbatch", host))

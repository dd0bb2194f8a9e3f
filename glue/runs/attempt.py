"""Starting an attempt of a run on its VMs: the one path `glue deploy` and `glue recover` (and so `glue
watch`, which recovers) take. Its steps, in order, each a method of `Attempt`:

  check     each VM has the command (or the image)                       check()
  prepare   each node gets the bucket credentials and, for a run with a   prepare()
            workdir or requirements, its code and venv from the bucket
  start     the attempt recorded, the launch spec handed to each node     start()
            (0600, on its tmpfs) and its supervisor started detached
  wait      each supervisor reported its pids                            (start's last step)

A serverless attempt (runtime lyceum-run) is one execution instead: glue.runs.serverless.start_execution,
with the same trainer environment (glue.runs.trainer_env) and attempt record (glue.runs.records).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import config as runconfig
from glue.runs import docker_run, remote, trainer_env, workspace
from glue.runs import vm_group as group_mod
from glue.runs.records import AttemptNode, AttemptRecord
from glue.runs.store import RunStore
from glue.runs.vm_group import GroupSpec
from glue.shell_secrets import from_shell
from glue.train.run import torchrun
from glue.train.run.launch import LaunchSpec, SpecBucket, node_vars
from glue.train.run.start import WARM_DIR
from glue.train.run.torchrun import Rendezvous
from glue.train.state_paths import StatePaths
from glue.workdir.pin import Workspace

# The supervisor's Python start: a second on a real VM; on an emulated one (qemu without KVM) under load
# its imports alone took 40 s.
SUPERVISOR_START_S = 180

Ready = dict[str, Any] | None  # a node's prepared workspace (python, code_dir, hashes); None: nothing prepared


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


def _from_head(record: AttemptRecord, prepared: bool) -> None:
    """The attempt's own pids, start time and prepared code: node 0's, as its supervisor reported them."""
    head = record.nodes[0]
    record.update(**{name: pid for name, pid in (("supervisor_pid", head.supervisor_pid),
                                                 ("trainer_pid", head.trainer_pid)) if pid is not None})
    if prepared:  # written with the node's (null where the run has no workdir, or no requirements)
        record.update(code_sha256=head.code_sha256, requirements_set=head.requirements_set)
    if head.started_at is not None:
        record.started_at = head.started_at


@dataclass
class Attempt:
    """Attempt `number` of a run on `hosts` (node k on hosts[k]): what starting it needs, held once."""

    home: Path
    store: RunStore
    rc: runconfig.RunConfig
    hosts: list[Host]
    number: int
    resume: bool
    memory_limit_mb: int | None = None
    group: GroupSpec = field(default_factory=GroupSpec)
    ws: Workspace = field(default_factory=Workspace)
    rdzv: Rendezvous | None = None  # a distributed group's; probed at start when not given

    @property
    def paths(self) -> StatePaths:
        return StatePaths.of(self.store.run, self.number)

    def check(self) -> list[list[str]]:
        """The argv per node; refuses when a VM lacks the command or image."""
        return [check_command(self.home, host, self.rc, self.ws) for host in self.hosts]

    def prepare(self) -> list[Ready]:
        """Each node gets the bucket credentials and, for a run with a workdir or requirements, its code and
        virtualenv for this attempt, from the bucket by the manifest's hashes. Starts nothing: a node that
        cannot (a package that does not match its hash) refuses before the attempt is recorded."""
        ready: list[Ready] = []
        for host in self.hosts:
            workspace.push_credentials(self.home, host, self.store)
            ready.append(workspace.prepare(self.home, host, self.store, self.ws, self.number)
                         if self.ws.needs_prepare else None)
        return ready

    def start(self, argvs: list[list[str]], ready: list[Ready] | None = None) -> AttemptRecord:
        """Record the attempt, then start one supervisor per node (with a distributed group each runs the
        command under torchrun at the rendezvous) and wait until each has started the trainer. `ready`:
        the nodes as the caller prepared them (else prepared here). Returns the attempt record."""
        if ready is None:
            ready = self.prepare()
        if self.group.distributed and self.rdzv is None:
            self.rdzv = group_mod.rendezvous(self.home, self.hosts, [remote.python(h) for h in self.hosts])
        # Built before anything is recorded: a secret missing here (a recovery does not preflight them) leaves
        # no attempt record behind.
        env = {**self.rc.env, **from_shell(self.rc.secrets, f"run the command again (run {self.store.run})"),
               **trainer_env.for_vm(self.store, self.rc, self.number, self.resume).to_env(), "PYTHONUNBUFFERED": "1"}
        record = self._record()
        self.store.put_attempt(record)
        for k, host in enumerate(self.hosts):
            self._launch_node(k, host, argvs[k], ready[k], env, record.nodes[k])
        for k, host in enumerate(self.hosts):
            record.nodes[k].add_pids(self._wait_started(host))
        _from_head(record, prepared=bool(ready[0]))
        self.store.put_attempt(record)
        return record

    def _record(self) -> AttemptRecord:
        head = self.hosts[0]
        record = AttemptRecord(
            run=self.store.run, attempt=self.number, vm=head.name, vm_id=head.id, backend=head.backend,
            resume=self.resume, memory_limit_mb=self.memory_limit_mb,
            nodes=[AttemptNode(node=k, vm=h.name, vm_id=h.id) for k, h in enumerate(self.hosts)])
        record.update(rendezvous=self.rdzv.endpoint if self.rdzv else None)  # null without a group, as before
        return record

    def _launch_node(self, k: int, host: Host, argv: list[str], ready: Ready, env: dict[str, str],
                     node: AttemptNode) -> None:
        """Node k's launch spec onto its VM, and its supervisor started in the background."""
        docker = self.rc.runtime == "docker"
        if ready:
            node.update(code_sha256=ready["package_sha256"], requirements_set=ready["requirements_set"])
        argv, node_env, cwd = workspace.launch(argv, remote.python(host), env, ready, docker)
        if self.rdzv is not None:
            argv = torchrun.torchrun_argv(argv[0] if ready else remote.python(host), argv, self.group, self.rdzv, k,
                                          self.store.run, self.number)
        # The interface gloo/nccl bind to comes first: a user's own setting in run.yaml `env` wins.
        node_env = {**(torchrun.node_env(self.rdzv, k) if self.rdzv is not None else {}), **node_env,
                    **node_vars(k, host.name)}
        paths = self.paths
        if docker:
            gpus = docker_run.docker_gpus(self.home, host)
            node.update(docker_gpus=gpus)
            argv = docker_run.docker_argv(self.store.run, self.number, str(self.rc.image), argv, paths.env_file,
                                          gpus=gpus, code_dir=cwd)
            ssh.put_file(self.home, host, paths.env_file, "".join(f"{n}={v}\n" for n, v in node_env.items()).encode())
        info = self.store.info
        spec = LaunchSpec(run=self.store.run, attempt=self.number, node=k, command=argv, env=node_env,
                          memory_limit_mb=self.memory_limit_mb, credentials_file=remote.CREDENTIALS_PATH,
                          cwd=cwd if cwd and not docker else remote.SCRATCH,
                          bucket=SpecBucket(name=info.name, endpoint=info.endpoint, region=info.signing_region))
        ssh.put_file(self.home, host, paths.spec, spec.to_json())
        py = shlex.quote(remote.python(host))
        # Only the supervisor goes to the background, its output redirected: a backgrounded `a && b && c &`
        # would be a subshell holding the SSH session's pipes until the supervisor exits (the command
        # then returned only at ssh.run's 2 s end-of-output deadline). Where a warm trainer process waits or
        # loads (a warm spare), glue.train.run.start hands it the attempt (else it execs the supervisor) and ends
        # the warm processes still waiting there.
        start = (f"mkdir -p {remote.SCRATCH} && cd {remote.SCRATCH} && {{ m=glue.train.run.supervise; "
                 f"for w in {WARM_DIR}/*.sock {WARM_DIR}/*.starting; do [ -e \"$w\" ] && m=glue.train.run.start; done; "
                 f"setsid {py} -m $m "
                 f"{shlex.quote(paths.spec)} </dev/null >{paths.supervisor_log} 2>&1 & }}")
        res = ssh.run(self.home, host, start, timeout=30)
        if res.exit_code != 0:
            raise GlueError(f"{host.name}: could not start the trainer: {res.stderr.strip()}")

    def _wait_started(self, host: Host) -> dict[str, Any]:
        deadline = time.monotonic() + SUPERVISOR_START_S
        while time.monotonic() < deadline:
            state = remote.process_state(self.home, host, self.store.run, self.number)
            if state["pids"]:
                return dict(state["pids"])
            time.sleep(0.2)
        raise GlueError(f"{host.name}: the trainer's supervisor did not start within {SUPERVISOR_START_S}s "
                        f"(see {self.paths.supervisor_log} on the VM)")

"""Warm spares: VMs created, configured and verified like the cluster's, kept idle for recoveries.

take     a recovery's lost VMs get spares at once, without terraform: each spare is checked (the VM
         exists, answers SSH, its bucket mount lists, its last verify was ready), recorded as serving
         under the lost VM's name (glue.cluster.spare_roles) and the inventory rewritten. All or none:
         a group whose lost VMs outnumber the healthy spares is provisioned as without spares.
refill   in a detached process (`python -m glue.operations.spares <home>`, log <home>/logs/spares.log):
         terraform's state catches up (the lost VM deleted, the spare's state moved to its address,
         renamed in place by the apply), the apply makes new spares, which are configured and verified,
         and each gets its warm trainer process (glue.operations.warm_spares).
A spare that died while idle fails the check, is never handed to a run, and the refill's apply
re-creates it (terraform reads it as gone).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import current, spare_roles
from glue.errors import GlueError
from glue.infra import inventory
from glue.infra.inventory import Host
from glue.infra.terraform import Terraform, vm_address
from glue.operations import converge, convergence, lifecycle, warm_spares
from glue.runs.records import AttemptNode


def log_path(home: Path) -> Path:
    return home / "logs" / "spares.log"


def take(home: Path, console: Console, lost: list[tuple[str, str | None]], run: str) -> list[spare_roles.Taken] | None:
    """Healthy spares for the `lost` VMs ((name, id of the VM to delete later, or None)), recorded as serving
    under their names; None when there are not enough healthy spares."""
    with spare_roles.locked(home):
        pool = current.spares(home)
        if not pool:
            return None
        backend = current.backend(home)
        gone = {s.name for s in pool if backend.read_vm(s.id) is None}
        problems = {**dict.fromkeys(gone, "gone"),
                    **converge.live_problems(home, [s for s in pool if s.name not in gone])}
        for name, problem in sorted(problems.items()):
            console.print(f"[yellow]spare {name}[/]: {problem}; not handed to a run (the refill replaces it)")
        healthy = [s for s in pool if s.name not in problems]
        if len(healthy) < len(lost):
            return None
        at = spare_roles.now()
        entries = [spare_roles.Taken(name=name, spare=s.name, id=s.id, old_id=old, run=run, at=at,
                                     idle_since=convergence.converged_at(home, s.id))
                   for (name, old), s in zip(lost, healthy, strict=False)]
        spare_roles.add(home, entries)
        _write_inventory(home)
    return entries


SparesUsed = dict[str, dict[str, Any]]  # {lost VM name: {spare, idle_since, taken_at}}


def for_recovery(home: Path, console: Console, nodes: list[AttemptNode], same_vm: bool,
                 keep: list[lifecycle.KeptVM], run: str) -> tuple[list[Host], list[str], SparesUsed] | None:
    """Warm spares for the VMs `provision` would replace (the node of a single-node run, a group's lost or
    kept VMs), taken at once with no terraform run; None without enough healthy spares (then `provision`).
    Returns the hosts in node order, the names served by spares, and {name: {spare, idle_since, taken_at}}."""
    cfg = current.ClusterConfig.load(home)
    if same_vm or not cfg.spares:
        return None
    backend = get_backend(cfg.backend, home)
    kept = {k.name for k in keep}
    out = [nd for nd in nodes if len(nodes) == 1 or nd.vm in kept or backend.read_vm(str(nd.vm_id)) is None]
    pending = {t.name for t in spare_roles.taken(home)}
    if not out or any(nd.vm not in cfg.vm_names() or nd.vm in pending for nd in out):
        return None  # a name outside the cluster (provision says so), or one a spare already serves unsettled
    used = take(home, console, [(nd.vm, None if nd.vm in kept else str(nd.vm_id))
                                       for nd in out], run)
    if used is None:
        console.print("no healthy warm spare for every lost VM: provisioning with terraform")
        return None
    if keep:
        tf = Terraform(home, cfg.backend, console)
        with tf.locked():
            for vm in keep:
                tf.state_rm(vm_address(vm.name))  # the kept VM lives on outside the state
                lifecycle.keep(home, vm)
    for t in used:
        console.print(f"provision: warm spare {t.spare} takes the place of {t.name}")
    return ([current.host(home, nd.vm) for nd in nodes], sorted(t.name for t in used),
            {t.name: {"spare": t.spare, "idle_since": t.idle_since, "taken_at": t.at} for t in used})


def _write_inventory(home: Path) -> None:
    """The inventory and known_hosts as the VMs serve now (host keys stay pinned by address)."""
    cfg = current.ClusterConfig.load(home)
    outputs = Terraform(home, cfg.backend).outputs()
    serving = {h.name: h for h in spare_roles.applied(home, inventory.hosts_from_outputs(outputs))}
    inventory.write(home, inventory.outputs_of(serving, inventory.bucket_from_outputs(outputs)),
                    also_known=lifecycle.kept_host_keys(home))


def refill(home: Path, console: Console) -> list[str]:
    """Terraform's state caught up with the spares taken, the pool made whole again, the new spares
    configured and verified. Returns the spares converged."""
    cfg = current.ClusterConfig.load(home)
    image = converge.image_hash(cfg.backend, home)
    with converge.applying_unless_down(home, cfg.backend, console, image) as step:
        if step is None:  # a `glue down` came first: refilling would bring the cluster back
            console.print("spare refill: the cluster is down; nothing to refill")
            return []
        cfg = current.ClusterConfig.load(home)  # a `glue up` may have changed it while we waited
        step.tf.apply(current.tf_vars(home, cfg))
        convergence.record_apply(home, convergence.terraform_inputs(cfg.backend, current.tf_vars(home, cfg)))
        outputs = step.tf.outputs()
        step.settle()
        written = inventory.write(home, outputs, also_known=lifecycle.kept_host_keys(home))
    pool = [h for h in written if h.name in cfg.spare_names()]
    parts = convergence.vm_parts(home, image)
    done = converge.converge(home, console, pool, parts, label="spare ")
    if done.names:
        converge.capture_seed(home, console, [h for h in pool if h.name in done.names], parts)
    warm_spares.arm(home, console, pool)  # the new spare's warm trainer process (glue.train.run.warm)
    return done.names


def wanted(home: Path) -> int:
    return current.ClusterConfig.load(home).spares


def start_refill(home: Path) -> int:
    """The refill in a detached process (it outlives the command that took a spare); returns its pid."""
    log = log_path(home)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "glue.operations.spares", str(home)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "GPUKIT_HOME": str(home)})
    pid_path(home).write_text(f"{proc.pid}\n")
    return proc.pid


def pid_path(home: Path) -> Path:
    """The last refill's process id (its own session: a test or a user can stop it with its group)."""
    return home / "logs" / "spares.pid"


def main(argv: list[str]) -> int:
    home = Path(argv[0])
    console = Console(stderr=True, force_terminal=False, width=120)
    try:
        converged = refill(home, console)
    except GlueError as exc:
        console.print(f"spare refill failed: {exc}")
        return 1
    console.print(f"spare pool refilled ({', '.join(converged) or 'nothing to configure'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

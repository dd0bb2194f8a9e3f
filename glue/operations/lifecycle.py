"""The cluster's lifecycle: bring it up (terraform, inventory, Ansible), tear it down behind the down
guard, and report on it. Sits above glue.runs: the down guard asks the monitor whether runs are done."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import current, slurm_vars, spare_roles
from glue.cluster.current import ClusterConfig, all_hosts, bucket_info, hosts, tf_vars
from glue.errors import GlueError
from glue.images import build, disk, recipe
from glue.infra import inventory, preflight, ssh
from glue.infra.terraform import Terraform, is_spare, vm_address
from glue.operations import converge, convergence, down_guard, spare_state, warm_spares
from glue.storage import bucket as bucket_store


def up(home: Path, cfg: ClusterConfig, console: Console, configure: bool = True,
       force: bool = False, converge_all: bool = False) -> list[inventory.Host]:
    """terraform apply, then inventory + known_hosts, then the Ansible playbook (when configure) on the VMs
    whose configuration changed (`converge_all`: on every VM). With nothing changed and every VM alive,
    no apply and no playbook: only the checks that show nothing changed."""
    backend = get_backend(cfg.backend, home)
    spares_problem = backend.spares_problem() if cfg.spares else None
    if spares_problem:
        raise GlueError(f"--spares {cfg.spares}: {spares_problem}")
    preflight.check_terraform()
    backend.check_host()
    variables = tf_vars(home, cfg)  # bad input (e.g. GPUKIT_VM_MEMORY_GB) fails before a bake
    for reason in guard_removals(home, cfg, force):
        console.print(f"[yellow]--force:[/] {reason}")
    image = None
    if backend.baked_image is not None:
        image = bake_image(home, console, boot_disk=backend.baked_image == "disk")
    inputs = convergence.terraform_inputs(cfg.backend, variables)
    written = unchanged_vms(home, cfg, inputs)
    if written is not None:
        if backend.bucket_on_host:
            bucket_info(home)  # as an apply would: the bucket this machine serves is started again if it stopped
        console.print(f"terraform: nothing to change ({len(written)} VM(s) up)")
    else:
        with converge.applying(home, cfg.backend, console, image) as step:
            step.tf.apply(variables)
            cfg.save(home)  # only once terraform accepted it: a rejected vm_count must not stick
            step.settle()
            convergence.record_apply(home, inputs)
            outputs = step.tf.outputs()
            remove_orphans(home, cfg.backend, outputs, console, spare={k.id for k in kept(home)})
        written = inventory.write(home, outputs, also_known=kept_host_keys(home))
    if configure:
        slurm_vars.write(home, cfg, written)  # the scheduler's group vars: a change converges every VM
        converge_changed(home, console, written, image, converge_all)
        warm_spares.arm(home, console, [h for h in written if is_spare(h.name)])  # each idle spare's trainer
    return written


def unchanged_vms(home: Path, cfg: ClusterConfig, inputs: str) -> list[inventory.Host] | None:
    """The cluster's VMs when an apply would change nothing: terraform's inputs are those of the last
    apply, every VM it made is alive and no VM of this kit home is outside its state. Else None."""
    if convergence.applied(home) != inputs or ClusterConfig.load(home) != cfg:
        return None
    current = all_hosts(home)
    backend = get_backend(cfg.backend, home)
    if sorted(h.name for h in current) != sorted(cfg.vm_names() + cfg.spare_names()) or spare_roles.taken(home):
        return None  # a VM or spare missing, or a spare taken that terraform's state does not say yet
    if any(backend.read_vm(h.id) is None for h in current):
        return None
    if set(backend.owned_vm_ids()) - {h.id for h in current} - {k.id for k in kept(home)}:
        return None  # an interrupted apply's orphan: the full path removes it
    return current


def converge_changed(home: Path, console: Console, vms: list[inventory.Host], image: str | None,
                     converge_all: bool = False) -> None:
    """The playbook (and verify) on the VMs whose configuration changed or that fail a live check, each
    named with the reason; none when nothing changed."""
    parts = convergence.vm_parts(home, image)
    asked = dict.fromkeys((h.name for h in vms), "asked (--converge)") if converge_all else None
    done = converge.converge(home, console, vms, parts, why=asked, whole_cluster=True)
    if not done.names:
        console.print(f"configuration: nothing changed on {len(vms)} VM(s){done.note}; `glue up --converge` runs "
                      "the playbook anyway")
    # The seed of this configuration, when there is none: from a VM just converged, else from one converged
    # before at these parts (a seed dropped while nothing changed is taken again).
    converge.capture_seed(home, console, [h for h in vms if h.name in done.names], parts,
                          earlier=[h for h in vms if h.name not in done.names])


def guard_removals(home: Path, cfg: ClusterConfig, force: bool) -> list[str]:
    """Before an apply that removes VMs (fewer --vms, another --name-prefix): the down guard on those VMs,
    so no run loses its VM or its pending uploads to a `glue up`. Another backend while VMs live on the
    old one is refused outright: they would be left running where no command of this kit home looks."""
    previous = ClusterConfig.load(home)
    current = hosts(home)
    if current and previous.backend != cfg.backend:
        raise GlueError(f"this cluster has {len(current)} VM(s) on the {previous.backend} backend; `glue down` "
                        f"first, then `glue up --backend {cfg.backend}`")
    leaving = [h for h in current if h.name not in cfg.vm_names()]
    if not leaving:
        return []
    names = ", ".join(h.name for h in leaving)
    return down_guard.check(home, force, only={h.id for h in leaving}, what=f"remove {names}",
                            alternative=f", keep them (`glue up --vms {previous.vms} --name-prefix "
                                        f"{previous.name_prefix}`)")


def bake_image(home: Path, console: Console, boot_disk: bool = False) -> str:
    """Local and qemu VMs boot the gpukit image: bake it here, with progress, rather than silently inside
    terraform's first create (cached: a no-op while the recipe is unchanged); qemu VMs also need its
    boot disk (cached next to it). Returns the image's hash."""
    rec = recipe.load("gpukit")
    with console.status(f"image {rec.name}: checking the cache") as status:
        image, baked = build.build(rec, home, lambda what: status.update(f"image {rec.name}: {what}"))
        if boot_disk:
            status.update(f"image {rec.name}: boot disk")
            disk.boot_disk(image)
    if baked:
        console.print(f"image {image.name} {image.hash[:16]} baked: {image.size_bytes / 1e6:.0f} MB "
                      f"in {image.build_seconds:.0f} s")
    return image.hash


def down(home: Path, console: Console, force: bool = False) -> int:
    """Destroy the VMs once nothing would be lost (see glue.operations.down_guard); the bucket is never destroyed.
    Returns how many VMs there were to destroy."""
    cfg = ClusterConfig.load(home)
    preflight.check_terraform()
    for reason in down_guard.check(home, force):
        console.print(f"[yellow]--force:[/] {reason}")
    tf = Terraform(home, cfg.backend, console)
    with tf.locked():
        had = len(tf.outputs().get("vms") or {})
        tf.apply(tf_vars(home, cfg), destroy=True)
        outputs = tf.outputs()
        removed = remove_orphans(home, cfg.backend, outputs, console)
        spare_state.forget_all(home)
    for vm_id in removed:
        forget_kept(home, vm_id)
    convergence.forget(home)
    inventory.write(home, {"vms": {}, "bucket": outputs.get("bucket", {})})
    return had + len(removed)


def destroy_vm(home: Path, console: Console, name: str, vm_id: str) -> None:
    """A VM gone for good, as a cloud takes one (a drill's victim): the backend deletes it; where only
    terraform deletes VMs (your own module's), a targeted terraform destroy of its resource. The cluster
    still asks for the name, so the next apply (the recovery's) makes it again."""
    cfg = ClusterConfig.load(home)
    backend = current.backend(home)
    if backend.deletes_vms:
        backend.delete_vm(vm_id)
        return
    with converge.applying(home, cfg.backend, console, converge.image_hash(cfg.backend, home)) as step:
        step.tf.apply(tf_vars(home, cfg), destroy=True, target=[vm_address(name)])
        step.settle()
    if backend.read_vm(vm_id) is not None:
        raise GlueError(f"VM {name} ({vm_id}) is still there after terraform destroyed its resource; look at "
                        "`glue status` and your module's state")


def remove_orphans(home: Path, backend_name: str, outputs: dict[str, Any], console: Console,
                   spare: set[str] | None = None) -> list[str]:
    """Delete VMs this kit home created that Terraform's state does not hold: an apply killed before it
    recorded a create leaves them running (and billed) where no `glue down` would look. Call it under
    `Terraform.locked()`, so no apply of ours is creating VMs at the same moment. `spare`: VMs kept
    for debugging (`glue watch --keep-failed`), which only `glue down` removes."""
    backend = get_backend(backend_name, home)
    in_state = {str(vm.get("id")) for vm in (outputs.get("vms") or {}).values()}
    orphans = [vm_id for vm_id in backend.owned_vm_ids() if vm_id not in in_state and vm_id not in (spare or set())]
    known = {k.id: k for k in kept(home)}
    for vm_id in orphans:
        backend.delete_vm(vm_id)
        if vm_id in known:
            console.print(f"[yellow]removed[/] VM {vm_id}: kept for debugging after {known[vm_id].failure_class} "
                          f"of run {known[vm_id].run}")
        else:
            console.print(f"[yellow]removed[/] VM {vm_id}: created by an interrupted run, never recorded in the state")
    return orphans


# -- VMs kept for debugging ----------------------------------------------------------------------
@dataclass
class KeptVM:
    """A failed VM left running for debugging (`--keep-failed`): out of Terraform's state (the run's VM
    name now belongs to its replacement), listed by `glue status`, removed by `glue down`."""

    name: str
    id: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    host_key: str
    run: str
    attempt: int
    failure_class: str
    kept_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _kept_dir(home: Path) -> Path:
    return home / "kept"


def keep(home: Path, vm: KeptVM) -> None:
    path = _kept_dir(home)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{vm.id}.json").write_text(json.dumps(vm.as_dict(), indent=1))


def forget_kept(home: Path, vm_id: str) -> None:
    (_kept_dir(home) / f"{vm_id}.json").unlink(missing_ok=True)


def kept_host(vm: KeptVM) -> inventory.Host:
    """A kept VM as an SSH target (its host key pinned, as in known_hosts)."""
    return inventory.Host(name=vm.name, id=vm.id, ssh_host=vm.ssh_host, ssh_port=vm.ssh_port, ssh_user=vm.ssh_user,
                          host_key=vm.host_key, gpu_type="none", gpu_count=0, backend="")


def kept_host_keys(home: Path) -> list[tuple[str, int, str]]:
    """(host, port, host key) of the kept VMs: still trusted over SSH, though out of the cluster."""
    return [(k.ssh_host, k.ssh_port, k.host_key) for k in kept(home)]


def kept(home: Path) -> list[KeptVM]:
    """The kept VMs that still exist (a record whose VM has gone is dropped)."""
    path = _kept_dir(home)
    if not path.is_dir():
        return []
    backend = current.backend(home)
    out = []
    for rec in sorted(path.glob("*.json")):
        try:
            vm = KeptVM(**json.loads(rec.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if backend.read_vm(vm.id) is None:
            rec.unlink(missing_ok=True)
        else:
            out.append(vm)
    return out


def status(home: Path, verify: bool = False) -> dict[str, Any]:
    """The `glue status --json` shape: {"vms": [...], "bucket": {...}}; each VM carries the playbook's
    verify summary (mount round trip, GPU/driver facts, trainer runtime): the last one, or a fresh one."""
    from glue.infra import ansible

    cfg = ClusterConfig.load(home)
    current = all_hosts(home)
    if verify and current:
        ansible.verify(home, progress=False)
    record = ansible.last_verify(home) or {}
    checks = record.get("hosts", {})
    vms: list[dict[str, Any]] = [
        {"name": h.name, "role": "spare" if is_spare(h.name) else "vm", "id": h.id, "ssh_host": h.ssh_host,
         "ssh_port": h.ssh_port, "ssh_user": h.ssh_user,
         "gpu_type": h.gpu_type, "gpu_count": h.gpu_count, "backend": h.backend, "market": h.market,
         "reachable": ssh.reachable(home, h),
         "verify": checks.get(h.name) if checks.get(h.name, {}).get("vm_id", h.id) == h.id else None,
         "verified_at": record.get("checked_at")}
        for h in current
    ]
    bucket: dict[str, Any] = {"endpoint": None, "name": None, "reachable": False}
    try:
        info = bucket_info(home)
    except GlueError as exc:
        bucket["error"] = str(exc)
    else:
        creds = get_backend(cfg.backend, home).bucket_credentials()
        bucket = {"endpoint": info.endpoint, "name": info.name, "region": info.region,
                  "reachable": bucket_store.reachable(info, creds)}
    # Idle = verified ready while a spare; one still being configured (a refill) is not counted.
    idle = sum(1 for v in vms if v["role"] == "spare" and (v["verify"] or {}).get("ready"))
    pool = {"wanted": cfg.spares, "idle": idle,
            "taken": [asdict(t) for t in spare_roles.taken(home)]}
    return {"backend": cfg.backend, "vms": vms, "spares": pool, "bucket": bucket,
            "kept": [k.as_dict() for k in kept(home)]}



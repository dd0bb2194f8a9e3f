"""The cluster's lifecycle: bring it up (terraform, inventory, Ansible), tear it down behind the down
guard, and report on it. Sits above glue.runs: the down guard asks the monitor whether runs are done."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import current, spare_roles
from glue.cluster.current import ClusterConfig, all_hosts, bucket_info, hosts, tf_vars
from glue.errors import GlueError
from glue.images import build, disk, recipe
from glue.infra import inventory, preflight, ssh
from glue.infra.terraform import Terraform, is_spare
from glue.operations import convergence, down_guard, spare_state, vm_seed
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
        tf = Terraform(home, cfg.backend, console)
        with tf.locked():
            moved = spare_state.reconcile(home, tf)  # spares taken by recoveries: under the lost VMs' names
            forget_stale_seed(home, image)
            tf.apply(variables)
            cfg.save(home)  # only once terraform accepted it: a rejected vm_count must not stick
            spare_state.settled(home, moved)
            convergence.record_apply(home, inputs)
            outputs = tf.outputs()
            remove_orphans(home, cfg.backend, outputs, console, spare={k.id for k in kept(home)})
        written = inventory.write(home, outputs, also_known=kept_host_keys(home))
    if configure:
        converge_changed(home, console, written, image, converge_all)
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
    names = [h.name for h in vms]
    why = dict.fromkeys(names, "asked (--converge)") if converge_all else stale(home, vms, parts)
    seeded = self_configured(home, console, vms, why, parts)
    if not why:
        console.print(f"configuration: nothing changed on {len(vms)} VM(s){seeded}; `glue up --converge` runs the "
                      "playbook anyway")
        capture_seed(home, console, [], parts, earlier=vms)  # a seed dropped meanwhile is taken again
        return
    for name, reason in sorted(why.items()):
        console.print(f"converging {name}: {reason}")
    configure_hosts(home, console, limit=None if len(why) == len(vms) else sorted(why), verify=True)
    convergence.record_converged(home, sorted(why), parts)
    capture_seed(home, console, [h for h in vms if h.name in why], parts, earlier=[h for h in vms if h.name not in why])


def forget_stale_seed(home: Path, image: str | None) -> None:
    """Before an apply: no VM may boot the seed of a configuration that has changed since."""
    if vm_seed.current_key(home) is not None:
        parts = convergence.vm_parts(home, image) if inventory.inventory_path(home).is_file() else {}
        now = vm_seed.shared_parts(next(iter(parts.values()))) if parts else convergence.local_parts(home, image)
        vm_seed.forget_stale(home, now)


def self_configured(home: Path, console: Console, vms: list[inventory.Host], why: dict[str, str],
                    parts: dict[str, convergence.VMParts], verify: bool = True) -> str:
    """Take out of `why` the new VMs that configured themselves at first boot from the seed of the
    configuration as it is now (glue.operations.vm_seed), verified (verify.yml, unless the caller
    verifies them itself), and record them converged. Returns a note."""
    from glue.infra import ansible

    new = [h for h in vms if why.get(h.name) == "never configured"]
    done = vm_seed.configured(home, new, parts) if new and vm_seed.current_key(home) else []
    if done and verify:
        checked = ansible.verify(home, limit=done, progress=False)
        for name in [n for n in done if not (checked.get(n) or {}).get("ready")]:
            why[name] = "configured from the seed, but its verify was not ready"
            done.remove(name)
    for name in done:
        del why[name]
        console.print(f"{name}: configured itself at first boot from the cluster's seed "
                      f"({vm_seed.current_key(home)}); no playbook")
    if done:
        convergence.record_converged(home, done, parts)
    return f" ({len(done)} configured from the seed)" if done else ""


def capture_seed(home: Path, console: Console, converged: list[inventory.Host],
                 parts: dict[str, convergence.VMParts], earlier: list[inventory.Host] | None = None) -> None:
    """After a converge and verify, or with nothing to converge: the seed of this configuration for the VMs
    created next, when there is none of it (once). From the first VM the playbook configured, of `converged`,
    then of `earlier` (converged before at these parts): a seed dropped while nothing changed is taken again."""
    hosts = [*converged, *(earlier or [])]
    if not hosts or not current.backend(home).takes_config_seed:
        return
    first = hosts[0]
    image = vm_seed.carried_elsewhere(home, first.name)
    if image:
        if converged or vm_seed.current_key(home):  # said once, not at every `glue up` with nothing to do
            vm_seed.forget(home)
            console.print(f"no configuration seed: {first.name}'s trainer runs in the Docker image {image}, which "
                          "lives in Docker's storage, not in a seed; new VMs are converged by the playbook")
        return
    if vm_seed.current_key(home) != vm_seed.key_of(parts[first.name]):
        taken = vm_seed.capture_first(home, hosts, parts)
        if taken is None:
            vm_seed.forget(home)
            console.print(f"no configuration seed: {', '.join(h.name for h in hosts)} had applied a seed at first "
                          "boot; the next VM converged without one gives it")
        else:
            console.print(f"configuration seed {taken[0]} captured from {taken[1]} (new VMs apply it at first boot)")


def stale(home: Path, vms: list[inventory.Host], parts: dict[str, convergence.VMParts]) -> dict[str, str]:
    """{VM name: why it needs the playbook}: its configuration changed since it was converged, or it fails
    the live check."""
    why = convergence.reasons(home, [h.name for h in vms], parts)
    why.update(live_problems(home, [h for h in vms if h.name not in why]))
    return why


def live_problems(home: Path, vms: list[inventory.Host]) -> dict[str, str]:
    """{VM name: problem} for the VMs that do not answer SSH, whose bucket mount is down or whose last
    verify was not ready: a configuration unchanged on paper is converged again for these."""
    from glue.infra import ansible

    checks = (ansible.last_verify(home) or {}).get("hosts", {})

    def problem(h: inventory.Host) -> str | None:
        last = checks.get(h.name) or {}
        if last.get("vm_id", h.id) == h.id and last and not last.get("ready"):  # (a recovery's converge has none)
            return "not ready at its last verify"
        try:
            # A FUSE mount whose rclone died is still listed: the listing must answer too.
            res = ssh.run(home, h, "systemctl is-active --quiet gpukit-mount.service && findmnt -n /mnt/s3 "
                                   ">/dev/null && timeout 5 ls /mnt/s3 >/dev/null", timeout=15)
        except GlueError:
            return "not reachable over SSH"
        return None if res.exit_code == 0 else "its bucket mount is not active"

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(zip([h.name for h in vms], pool.map(problem, vms), strict=True))
    return {name: p for name, p in found.items() if p is not None}


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


def image_hash(backend_name: str, home: Path) -> str | None:
    """The hash of the image the backend's VMs boot (None: a cloud image, named in terraform's inputs)."""
    if get_backend(backend_name, home).baked_image is None:
        return None
    return recipe.load("gpukit").content_hash()


def configure_hosts(home: Path, console: Console, limit: list[str] | None = None, verify: bool = False) -> None:
    """Run ansible/site.yml on `limit`; on the whole cluster or with `verify`, site.yml then verify.yml
    (whose per-host summary `glue status` shows) in one run."""
    from glue.infra import ansible

    if limit is not None and not verify:
        result = ansible.converge(home, limit=limit)
        summary: dict[str, dict[str, object]] = {}
    else:
        result, summary = ansible.converge_and_verify(home, limit=limit)
    failed = {h: m for h, m in result.failed.items() if h not in summary}
    if failed:
        by_message: dict[str, list[str]] = {}  # the same failure on every VM is said once
        for h, m in failed.items():
            by_message.setdefault(m, []).append(h)
        failures = "; ".join(f"{', '.join(hs)}: {m}" for m, hs in by_message.items())
        raise GlueError(f"configuring the VMs failed: {failures}")
    bad = [h for h, v in summary.items() if not v.get("ready")]
    if bad:
        raise GlueError(f"verify.yml: {', '.join(bad)} not ready; see `glue status`")


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



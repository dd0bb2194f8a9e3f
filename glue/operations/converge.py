"""The cluster's configuration sequences, written once: terraform's apply under its lock, and the
playbook on the VMs whose configuration is stale. `glue up` (glue.operations.lifecycle), the spare
refill (glue.operations.spares) and a recovery's provision and configure phases
(glue.operations.recovery.phases) all go through here.

applying   under terraform's lock: the spares earlier recoveries took moved into the state and a seed of a
           changed configuration dropped (no VM created now boots it) before the caller's apply; the
           spares' entries settled after it
converge   for the VMs given: why each needs the playbook (stale), those that configured themselves from
           the current seed taken out (self_configured), the playbook (and verify) on the rest, recorded
           converged; then the caller takes the seed of this configuration from one of them (capture_seed)
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from glue.cloud import get_backend
from glue.cluster import current
from glue.errors import GlueError
from glue.images import recipe
from glue.infra import inventory, ssh
from glue.infra.terraform import Terraform
from glue.operations import convergence, spare_state, vm_seed


@dataclass
class Apply:
    """Terraform under its lock, for one apply; `settle()` once the apply is done (else on leaving)."""

    tf: Terraform
    home: Path
    moved: set[str] = field(default_factory=set)
    settled: bool = False

    def settle(self) -> None:
        if not self.settled:
            spare_state.settled(self.home, self.moved)
            self.settled = True


@contextmanager
def _applying(home: Path, backend_name: str, console: Console, image: str | None,
              unless_down: bool) -> Iterator[Apply | None]:
    tf = Terraform(home, backend_name, console)
    with tf.locked():
        if unless_down and not tf.state_ids():
            yield None
            return
        step = Apply(tf, home, spare_state.reconcile(home, tf))  # spares taken by recoveries: under the lost VMs' names
        forget_stale_seed(home, image)
        yield step
        step.settle()


@contextmanager
def applying(home: Path, backend_name: str, console: Console, image: str | None) -> Iterator[Apply]:
    """Terraform's lock held for the caller's apply, with what every apply needs before and after it."""
    with _applying(home, backend_name, console, image, unless_down=False) as step:
        assert step is not None
        yield step


@contextmanager
def applying_unless_down(home: Path, backend_name: str, console: Console, image: str | None) -> Iterator[Apply | None]:
    """As `applying`, but None with nothing touched when terraform's state holds no VM (a `glue down` came
    first: an apply would bring the cluster back)."""
    with _applying(home, backend_name, console, image, unless_down=True) as step:
        yield step


@dataclass(frozen=True)
class Converged:
    names: list[str]  # the VMs the playbook converged
    seeded: list[str]  # the new VMs that configured themselves from the seed: no playbook

    @property
    def note(self) -> str:
        """How many configured themselves from the seed, for the caller's line."""
        return f" ({len(self.seeded)} configured from the seed)" if self.seeded else ""


def converge(home: Path, console: Console, vms: list[inventory.Host], parts: dict[str, convergence.VMParts], *,
             why: dict[str, str] | None = None, verify: bool = True, label: str = "",
             whole_cluster: bool = False) -> Converged:
    """The playbook on the VMs of `vms` that need it (`why`, else `stale`), each named with its reason, and
    recorded converged; those that configured themselves from the current seed need none. `verify`:
    verify.yml too (a recovery verifies in a phase of its own); `whole_cluster`: `vms` is every VM, so
    when all need it the playbook runs unlimited. Taking the seed afterwards is the caller's."""
    why = stale(home, vms, parts) if why is None else why
    seeded = self_configured(home, console, vms, why, parts, verify=verify)
    for name, reason in sorted(why.items()):
        console.print(f"converging {label}{name}: {reason}")
    todo = sorted(why)
    if todo:
        everyone = whole_cluster and len(todo) == len(vms)
        configure_hosts(home, console, limit=None if everyone else todo, verify=verify)
        convergence.record_converged(home, todo, parts)
    return Converged(todo, seeded)


def forget_stale_seed(home: Path, image: str | None) -> None:
    """Before an apply: no VM may boot the seed of a configuration that has changed since."""
    if vm_seed.current_key(home) is not None:
        parts = convergence.vm_parts(home, image) if inventory.inventory_path(home).is_file() else {}
        now = vm_seed.shared_parts(next(iter(parts.values()))) if parts else convergence.local_parts(home, image)
        vm_seed.forget_stale(home, now)


def self_configured(home: Path, console: Console, vms: list[inventory.Host], why: dict[str, str],
                    parts: dict[str, convergence.VMParts], verify: bool = True) -> list[str]:
    """Take out of `why` the new VMs that configured themselves at first boot from the seed of the
    configuration as it is now (glue.operations.vm_seed), verified (verify.yml, unless the caller
    verifies them itself), and record them converged. Returns their names."""
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
    return done


def capture_seed(home: Path, console: Console, converged: list[inventory.Host],
                 parts: dict[str, convergence.VMParts], earlier: list[inventory.Host] | None = None) -> None:
    """After a converge and verify, or with nothing to converge: the seed of this configuration for the VMs
    created next, when there is none of it (once). From the first VM the playbook configured, of `converged`,
    then of `earlier` (converged before at these parts): a seed dropped while nothing changed is taken again."""
    hosts = [*converged, *(earlier or [])]
    if not hosts or not current.backend(home).takes_config_seed:
        return
    if current.ClusterConfig.load(home).scheduler != "none":
        return  # a scheduler's node is made by the playbook (its config names every node, its key is not seeded)
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
    slurm = current.ClusterConfig.load(home).scheduler == "slurm"

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
        if res.exit_code != 0:
            return "its bucket mount is not active"
        if slurm and ssh.run(home, h, "systemctl is-active --quiet slurmd && systemctl is-active --quiet munge",
                                       timeout=15).exit_code != 0:
            return "slurmd or munge is not active"  # a node Slurm cannot use: the slurm role starts them again
        return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(zip([h.name for h in vms], pool.map(problem, vms), strict=True))
    return {name: p for name, p in found.items() if p is not None}


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
        said = sorted({str(sched["error"]) for h in bad  # the scheduler's check names its failing node
                       if isinstance(sched := summary[h].get("scheduler"), dict) and sched.get("error")})
        raise GlueError(f"verify.yml: {', '.join(bad)} not ready{''.join('; ' + s for s in said)}; see `glue status`")

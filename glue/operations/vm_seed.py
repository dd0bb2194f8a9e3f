"""The cluster's configuration seed: user-data a new VM applies at its first boot, so that a VM created
while the configuration is unchanged (a recovery's, a refilled spare, one `glue up` re-creates) needs no
playbook.

capture   after the playbook converged and verified a VM, the files it wrote there (the mount's
          settings, script, unit and credentials; the gpukit code in the baked venv: everything under
          SEED_ROOTS changed since the VM's first boot, by ctime, as copies keep their mtime) are read
          back over SSH into <home>/seeds/current.tar.gz (0600), with the key of the configuration they
          came from in current.key: a hash of the parts every VM shares (roles, group vars, bucket,
          credentials, code, image; glue.operations.convergence). Also at a `glue up` with nothing to
          converge when there is no seed of the configuration as it is (dropped, or a recovery's playbook
          run, which takes none): from a converged VM the playbook configured, never one that was seeded.
provide   terraform passes the file's path (never its contents) to the gpukit provider, which hands
          the file to each VM it creates, as clouds pass user-data; the image's first-boot unit
          unpacks it and starts the mount (images/gpukit/files/usr/local/sbin/gpukit-firstboot).
trust     a new VM counts as converged only when it reports the key of the configuration as it is now
          and its bucket mount lists; any change of a shared part drops the seed (`forget_stale`)
          before terraform creates a VM, so a VM never boots an outdated configuration unconverged.
Backends whose VMs take a seed: `Backend.takes_config_seed` (local: a bind-mounted folder; qemu: the
          seed disk). Not where the trainer runs in a Docker image: Docker's storage is not in a seed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from glue.cluster.current import config_seed_path
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.ansible_verify import last_verify
from glue.infra.inventory import Host
from glue.operations.convergence import VMParts

SEED_ROOTS = ("etc/gpukit", "etc/systemd/system", "usr/local", "opt/gpukit", "var/lib/gpukit")
NOT_SEEDED = ("var/lib/gpukit/seed", "var/lib/gpukit/firstboot.done", "var/lib/gpukit/configured-from")
FIRST_BOOT_MARK = "var/lib/gpukit/firstboot.done"
CONFIGURED_FROM = "/var/lib/gpukit/configured-from"
PER_VM_PARTS = ("cluster VMs", "inventory entry")  # not in the seed: it is the same for every VM
_SEEDED_EXIT = 3  # capture's script: this VM applied a seed at first boot
MOUNT_WAIT_S = 20  # a seeded VM's mount starts at boot: how long its check waits for it


def seed_path(home: Path) -> Path:
    return config_seed_path(home)


def key_path(home: Path) -> Path:
    return seed_path(home).with_name("current.key")


def parts_path(home: Path) -> Path:
    """The parts the seed's key hashes (digests only), which `forget_stale` compares before an apply."""
    return seed_path(home).with_name("current.parts.json")


def shared_parts(parts: VMParts) -> dict[str, str]:
    """The parts every VM shares: what a seed carries."""
    return {k: v for k, v in parts.parts.items() if k not in PER_VM_PARTS}


def key_of(parts: VMParts) -> str:
    """The configuration a seed carries, as one key."""
    return hashlib.sha256(json.dumps(shared_parts(parts), sort_keys=True).encode()).hexdigest()[:16]


def current_key(home: Path) -> str | None:
    try:
        return key_path(home).read_text().strip() if seed_path(home).is_file() else None
    except OSError:
        return None


def forget_stale(home: Path, now: dict[str, str]) -> None:
    """Drop the seed when a part known now differs from those it was captured with (call before an apply).
    With an inventory `now` is every shared part; after `glue down` only those known without one (roles,
    group vars, code, image: `convergence.local_parts`), and a changed bucket or credentials is caught at
    first boot (`configured`)."""
    if current_key(home) is None:
        return
    captured = _captured_parts(home)
    if {k: captured.get(k) for k in now} != now:
        forget(home)


def _captured_parts(home: Path) -> dict[str, str]:
    try:
        data = json.loads(parts_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def forget(home: Path) -> None:
    seed_path(home).unlink(missing_ok=True)
    key_path(home).unlink(missing_ok=True)
    parts_path(home).unlink(missing_ok=True)


def capture(home: Path, host: Host, parts: VMParts) -> str | None:
    """Read back the files the playbook wrote on `host` (just converged and verified) as the seed of its
    configuration. Returns the key; None when `host` had applied an older seed at first boot: the files that
    came with it are older than its first-boot mark, so what the playbook left unchanged would be missing."""
    roots = " ".join(shlex.quote(r) for r in SEED_ROOTS)
    skip = " ".join(f"-not -path {shlex.quote(p)} -not -path {shlex.quote(p + '/*')}" for p in NOT_SEEDED)
    script = (f"test ! -e {CONFIGURED_FROM} || exit {_SEEDED_EXIT}; "
              f"cd / && find {roots} -xdev -cnewer {FIRST_BOOT_MARK} \\( -type f -o -type l -o -type d \\) "
              f"-not -path '*/__pycache__*' {skip} -print0 | tar --null --no-recursion -T - -czf - | base64 -w0")
    res = ssh.run(home, host, f"sh -c {shlex.quote(script)}", timeout=120)
    if res.exit_code == _SEEDED_EXIT:
        return None
    if res.exit_code != 0:
        raise GlueError(f"{host.name}: reading its configuration back for the seed failed: "
                        f"{res.stderr.strip().splitlines()[-1:]}")
    data = base64.b64decode(res.stdout.strip())
    key = key_of(parts)
    seed_path(home).parent.mkdir(parents=True, exist_ok=True)
    tmp = seed_path(home).with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the bucket credentials
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    key_path(home).unlink(missing_ok=True)
    tmp.replace(seed_path(home))
    parts_path(home).write_text(json.dumps(shared_parts(parts), sort_keys=True))
    key_path(home).write_text(key + "\n")  # last: a seed without its key is never handed out
    return key


def capture_first(home: Path, hosts: list[Host], parts: dict[str, VMParts]) -> tuple[str, str] | None:
    """The seed of the configuration, from the first of `hosts` (converged at `parts`) that the playbook
    configured: (key, that host's name). A host that applied a seed at first boot is passed over (`capture`
    returns None for it); None when every host had."""
    for host in hosts:
        key = capture(home, host, parts[host.name])
        if key is not None:
            return key, host.name
    return None


def carried_elsewhere(home: Path, name: str) -> str | None:
    """The trainer image a converged VM runs in (its last verify says so), or None. A seed carries files,
    not what Docker keeps (/var/lib/docker): a VM whose trainer runtime is an image cannot be seeded."""
    summary = ((last_verify(home) or {}).get("hosts") or {}).get(name) or {}
    runtime = summary.get("runtime") or {}
    return str(runtime.get("image") or "?") if runtime.get("mode") == "image" else None


def configured(home: Path, hosts: list[Host], parts: dict[str, VMParts]) -> list[str]:
    """The hosts that applied the seed of the configuration as it is now at their first boot and whose
    bucket mount lists (waiting up to MOUNT_WAIT_S for it): these need no playbook."""
    if not hosts or not parts:
        return []
    key = key_of(next(iter(parts.values())))
    check = (f"test \"$(cat {CONFIGURED_FROM} 2>/dev/null)\" = {key} && timeout {MOUNT_WAIT_S} sh -c "
             "'until systemctl is-active --quiet gpukit-mount.service && findmnt -n /mnt/s3 >/dev/null; "
             "do sleep 0.2; done' && timeout 5 ls /mnt/s3 >/dev/null")
    def ok(h: Host) -> bool:
        try:
            return ssh.run(home, h, check, timeout=MOUNT_WAIT_S + 15).exit_code == 0
        except GlueError:
            return False

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpukit-seeded") as pool:
        return [h.name for h, good in zip(hosts, pool.map(ok, hosts), strict=True) if good]

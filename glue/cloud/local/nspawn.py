"""A local VM as a `systemd-nspawn --boot` machine on the baked image.

The VM's root is an overlay: the cached image read-only below, the VM's own disk directory
(`<vm_dir>/disk`) above, so deleting that directory is terminating the VM. The overlay is mounted
in a private mount namespace (`unshare -m`) that only nspawn and the machine live in: when they die
the mount goes with them, and the host never sees it. systemd is PID 1; the first-boot unit takes
the VM's identity from a read-only seed (NoCloud-style: hostname, SSH address, authorized key) and
makes the host key on the VM, printing it to the console, where `boot` reads it to pin it.
nspawn shares the host's network namespace: sshd listens on 127.0.0.1:<port> only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from glue.cloud import boot_console
from glue.errors import GlueError
from glue.process import children, command_lines

HOST = "127.0.0.1"
# ~0.5 s on an idle host; a whole minute seen once on a 2-core host booting several machines beside a busy suite.
# A machine that fails to boot is said at once (nspawn exits); this bounds only one that hangs.
BOOT_TIMEOUT = 180.0
# The Debian package each needed binary comes from (bootstrap installs them).
TOOLS = {"systemd-nspawn": "systemd-container", "unshare": "util-linux"}
# The environment nspawn starts in: nothing of the controller's (no keys, no kit paths, no tokens).
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
# Joins the VM's cgroups ($5), mounts the overlay inside the fresh mount namespace ($1..$4: paths),
# then becomes nspawn (which roots the machine's cgroup namespace there).
# nspawn's propagation directory must be on tmpfs; the host's /run may not be.
_LAUNCH = (
    'set -e; img=$1 up=$2 work=$3 root=$4 cgroups=$5; shift 5; '
    'for cg in $cgroups; do echo $$ > "$cg/cgroup.procs"; done; '
    'mkdir -p /run/systemd/nspawn; mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn; '
    'mount -t overlay overlay -o "lowerdir=$img,upperdir=$up,workdir=$work" "$root"; '
    'exec systemd-nspawn "$@"'
)


@dataclass(frozen=True)
class Machine:
    nspawn_pid: int
    init_pid: int
    host_key: str


def check_tools() -> None:
    for binary, package in TOOLS.items():
        if shutil.which(binary, path=ENV["PATH"]) is None:
            raise GlueError(f"{binary} is missing: install the Debian package {package} (`make bootstrap` does)")


def write_seed(seed: Path, hostname: str, port: int, authorized_key: str, config: Path | None = None) -> None:
    """The NoCloud-style seed the first-boot unit reads: public data, and `config` (the cluster's
    configuration seed, <x>.tar.gz with its key in <x>.key beside it) root-only when there is one."""
    seed.mkdir(parents=True, exist_ok=True)
    (seed / "meta-data").write_text(f"hostname={hostname}\nssh_listen={HOST}:{port}\n")
    (seed / "authorized_keys").write_text(authorized_key.strip() + "\n")
    key = config.with_name(config.name.removesuffix(".tar.gz") + ".key") if config else None
    if config is not None and key is not None and config.is_file() and key.is_file():
        for src, name in ((config, "config.tar.gz"), (key, "config.key")):
            fd = os.open(seed / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(src.read_bytes())


def launched_for(vm_dir: Path) -> list[int]:
    """Every process started for the machine in `vm_dir` (the launcher, nspawn) found by its command line, which
    names the machine's root: a boot interrupted before its pid was recorded (a provider killed between the
    spawn and the record, wider on a loaded host) still leaves a machine a teardown can find."""
    root = str(vm_dir / "root")
    return [pid for pid, argv in command_lines() if root in argv or f"--directory={root}" in argv]


def container_init(nspawn_pid: int) -> int | None:
    """The machine's PID 1 as the host sees it: the descendant of nspawn that is pid 1 in its namespace."""
    todo, seen = [nspawn_pid], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and len(line.split()) > 2 and line.split()[-1] == "1":
                    return pid
        except OSError:
            continue
        todo += children(pid)
    return None


def ssh_banner(port: int) -> bool:
    """True once an SSH server answers on 127.0.0.1:port (both kinds of local VM wait for this)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            return s.recv(16).startswith(b"SSH-")
    except OSError:
        return False


def boot(name: str, rootfs: Path, vm_dir: Path, port: int, cgroups: list[Path] | None = None,
         on_spawn: Callable[[int], None] | None = None) -> Machine:
    """Start the machine and return once sshd answers; the caller tears down on failure. `on_spawn` gets
    nspawn's pid the moment it exists: a process killed while the machine boots (Ctrl-C twice) leaves the
    pid where a later teardown finds it, not a machine that no command would stop."""
    disk = vm_dir / "disk"
    upper, work, root = disk / "upper", disk / "work", vm_dir / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    console = vm_dir / "console.log"
    nspawn_args = [
        "--quiet", "--boot", f"--directory={root}", f"--machine={name}", f"--hostname={name}",
        # No machined or systemd on the host to register with: nspawn runs as a plain process tree.
        "--register=no", "--keep-unit",
        "--console=read-only", "--link-journal=no", "--timezone=off", "--resolv-conf=copy-host",
        "--bind=/dev/fuse", f"--bind-ro={vm_dir / 'seed'}:/var/lib/gpukit/seed",
        # Root on a cloud VM may chattr +i (bucket_mount guards the bare /mnt/s3); nspawn drops it.
        "--capability=CAP_LINUX_IMMUTABLE",
    ]
    with open(console, "ab") as log:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _LAUNCH, "sh",
             str(rootfs), str(upper), str(work), str(root), " ".join(map(str, cgroups or [])), *nspawn_args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/", env=ENV,
        )
    try:
        if on_spawn is not None:
            on_spawn(proc.pid)
        return _wait_booted(name, proc, console, port)
    except BaseException:
        _kill(proc)  # a machine that did not come up must not keep running (nor hold its cgroups)
        raise


def _wait_booted(name: str, proc: subprocess.Popen[bytes], console: Path, port: int) -> Machine:
    deadline = time.monotonic() + BOOT_TIMEOUT
    init_pid: int | None = None
    host_key: str | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = boot_console.tail(console.read_text(errors="replace"), lines=2)
            raise GlueError(f"local VM {name} failed to boot (exit {proc.returncode}): {said}")
        init_pid = init_pid or container_init(proc.pid)
        if host_key is None:
            text = console.read_text(errors="replace")
            host_key = boot_console.host_key(text)
            if host_key is None and (failed := boot_console.failure(text)):
                raise GlueError(f"local VM {name}: its first boot failed: {failed}")
        if init_pid and host_key and ssh_banner(port):
            return Machine(nspawn_pid=proc.pid, init_pid=init_pid, host_key=host_key)
        time.sleep(0.05)
    what = "no host key on its console (first boot failed)" if host_key is None else \
        f"sshd did not answer on {HOST}:{port} (port taken by another process?)"
    raise GlueError(f"local VM {name}: {what} within {BOOT_TIMEOUT:.0f}s; its console's last lines: "
                    f"{boot_console.tail(console.read_text(errors='replace'))}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the machine's PID 1 (its whole PID namespace dies with it), then nspawn."""
    init_pid = container_init(proc.pid) if proc.poll() is None else None
    for pid in (init_pid, proc.pid):
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)

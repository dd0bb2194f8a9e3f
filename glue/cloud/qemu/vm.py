"""One qemu VM: the baked image's kernel booted straight from the host (no bootloader), a qcow2 overlay
on the image's boot disk, the NoCloud-style seed on a second small disk, user-mode networking.

Networking touches nothing but the host's loopback: `-netdev user,restrict=on` (the guest reaches
nothing outside), SSH forwarded from 127.0.0.1:<port> to the guest's :22, and one `guestfwd`: a
connection the guest opens to BUCKET_GUEST_ADDR is relayed (one `socat` per connection) to the
bucket on the host's 127.0.0.1:<bucket port>. Inside the guest, the first-boot unit sets up a
systemd-socket-proxyd listening on the guest's 127.0.0.1:<bucket port> that forwards there, so the
bucket endpoint VMs are given (`http://127.0.0.1:<port>`) is the same on every local backend.
No KVM: /dev/kvm hangs a stock kernel on this kind of host; TCG with a large translation cache.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from glue.cloud import boot_console
from glue.cloud.local.bucket import HOST, port_answers
from glue.errors import GlueError
from glue.images.disk import BootDisk
from glue.process import cpu_seconds

# A first boot's budget in qemu's own CPU time: TCG took ~20 s (~40 CPU-s) on an idle 2-core host and over 300 s
# of wall time on a busy one, where the emulator mostly waits for a core. A guest that halted (a kernel panic)
# is said at once; the wall-time limit only bounds one that is never scheduled.
BOOT_CPU_SECONDS = 300.0
BOOT_WALL_LIMIT = 1200.0
# sshd re-executes itself for every connection: under emulation its banner can take seconds.
BANNER_TIMEOUT = 20.0
MEMORY_MB = 1024
CPUS = 2  # MTTCG: one host thread per vCPU
GUEST_ADDRESS = "10.0.2.15/24"          # slirp's default guest address: where hostfwd delivers
BUCKET_GUEST_ADDR = "10.0.2.100:80"     # the guestfwd address inside slirp's network
SEED_LABEL = "cidata"                  # as cloud-init's NoCloud seed
# The Debian package each needed binary comes from (bootstrap installs them).
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils", "mke2fs": "e2fsprogs",
         "socat": "socat"}
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
KERNEL_ARGS = ("root=/dev/vda rw console=ttyS0 quiet loglevel=3 net.ifnames=0 "
               # Docker 20.10 (Debian's) does not start under this kernel's AppArmor without profiles.
               "apparmor=0 systemd.show_status=false")


def check_tools() -> None:
    for binary, package in TOOLS.items():
        if shutil.which(binary, path=ENV["PATH"]) is None:
            raise GlueError(f"{binary} is missing: install the Debian package {package} (`make bootstrap` does)")


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=ENV)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise GlueError(f"{what} failed: {tail[:300]}")


def ssh_banner(port: int, timeout: float) -> bool:
    """True once sshd answers on 127.0.0.1:port with its banner. qemu accepts the connection itself and
    closes it at once while nothing listens in the guest, so a long timeout does not slow the wait."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            return s.recv(16).startswith(b"SSH-")
    except OSError:
        return False


def write_seed_disk(path: Path, meta_data: str, authorized_key: str, config: Path | None = None) -> None:
    """The seed as a small ext4 volume labelled `cidata` (meta-data, authorized_keys) and, when `config`
    is given, the cluster's configuration seed (<x>.tar.gz with its key in <x>.key beside it), as clouds
    pass user-data: it holds the bucket credentials, so the volume and the files on it are root-only."""
    files = {"meta-data": meta_data.encode(), "authorized_keys": (authorized_key.strip() + "\n").encode()}
    key = config.with_name(config.name.removesuffix(".tar.gz") + ".key") if config else None
    if config is not None and key is not None and config.is_file() and key.is_file():
        files |= {"config.tar.gz": config.read_bytes(), "config.key": key.read_bytes()}
    with tempfile.TemporaryDirectory(prefix="gpukit-seed-") as tmp:
        for name, data in files.items():
            fd = os.open(Path(tmp) / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o600 if name.startswith("config.") else 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.truncate((4 << 20) + 2 * sum(len(d) for d in files.values()))  # room for ext4 itself
        _run(["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", SEED_LABEL, "-d", tmp, str(path)],
             "making the seed disk")


def meta_data(name: str, bucket_port: int) -> str:
    return (f"hostname={name}\nssh_listen=0.0.0.0:22\naddress={GUEST_ADDRESS}\n"
            f"bucket_listen={HOST}:{bucket_port}\nbucket_target={BUCKET_GUEST_ADDR}\n")


def make_overlay(base: Path, overlay: Path) -> None:
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(overlay)],
         "creating the VM's disk")


def command(name: str, boot: BootDisk, overlay: Path, seed: Path, console: Path, port: int,
            bucket_port: int) -> list[str]:
    guest_ip, guest_port = BUCKET_GUEST_ADDR.split(":")
    netdev = (f"user,id=net0,restrict=on,hostfwd=tcp:{HOST}:{port}-:22,"
              f"guestfwd=tcp:{guest_ip}:{guest_port}-cmd:socat -t 5 - TCP:{HOST}:{bucket_port}")
    return [
        "qemu-system-x86_64", "-name", name, "-nodefaults", "-no-user-config", "-display", "none",
        "-machine", "pc", "-accel", "tcg,tb-size=256", "-cpu", "max", "-m", str(MEMORY_MB), "-smp", str(CPUS),
        "-kernel", str(boot.kernel), "-initrd", str(boot.initrd), "-append", KERNEL_ARGS,
        # The overlay is the VM's ephemeral disk: it dies with the VM, so flushes need not reach the host disk.
        "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        "-drive", f"file={seed},if=virtio,format=raw,readonly=on",
        "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0",
        "-device", "virtio-rng-pci",
        "-serial", f"file:{console}",
    ]


def start(name: str, cmd: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """Start qemu; return once it listens on 127.0.0.1:port (so the port pick can be released)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                cwd="/", env=ENV)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-2:]
            raise GlueError(f"qemu VM {name} failed to start: {' '.join(tail) or f'exit {proc.returncode}'}")
        if port_answers(port):
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise GlueError(f"qemu VM {name}: qemu did not listen on {HOST}:{port} within 30s; log: {log}")


def wait_booted(name: str, proc: subprocess.Popen[bytes], console: Path, port: int, log: Path) -> str:
    """Wait until the guest printed its host key and sshd answers on 127.0.0.1:port; the host key.
    The caller kills qemu and removes the VM's files on failure."""
    started, deadline = cpu_seconds(proc.pid) or 0.0, time.monotonic() + BOOT_WALL_LIMIT
    host_key: str | None = None
    used = 0.0
    while time.monotonic() < deadline and used < BOOT_CPU_SECONDS:
        if proc.poll() is not None:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-2:]
            raise GlueError(f"qemu VM {name} exited while booting: {' '.join(tail) or f'exit {proc.returncode}'}")
        if host_key is None:
            text = console.read_text(errors="replace") if console.exists() else ""
            host_key = boot_console.host_key(text)
            if host_key is None and (failed := boot_console.failure(text)):
                raise GlueError(f"qemu VM {name}: its first boot failed: {failed}")
        if host_key and ssh_banner(port, BANNER_TIMEOUT):
            return host_key
        time.sleep(0.2)
        used = (cpu_seconds(proc.pid) or started) - started
    what = "no host key on its serial console (first boot failed)" if host_key is None else \
        f"sshd did not answer on {HOST}:{port}"
    spent = f"{used:.0f} CPU-seconds of emulation" if used >= BOOT_CPU_SECONDS else f"{BOOT_WALL_LIMIT:.0f}s"
    said = boot_console.tail(console.read_text(errors="replace")) if console.exists() else "(none)"
    raise GlueError(f"qemu VM {name}: {what} after {spent}; its console's last lines: {said}")

"""The local backend: VMs as namespaced process trees on this machine, the bucket as rclone serve s3.

A VM = `unshare --mount --uts --pid --fork` running glue.cloud.local.vm_init as its PID 1 (overlay of
the host root, private /root, tmpfs /run and /tmp, sshd on 127.0.0.1:<port>). Delete = SIGKILL that
PID 1 (the kernel then kills every process in the namespace, FUSE daemons included; the mount
namespace and its mounts go with them), then remove the disk directory.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local import vm_cgroup
from glue.cloud.local.bucket import HOST, LocalBucket, free_port, pid_alive
from glue.cloud.local.nspawn import ssh_banner
from glue.errors import GlueError
from glue.paths import write_secret
from glue.records import BucketCredentials, BucketInfo
from glue.train.notice import DEFAULT_NOTICE_FILE

BOOT_TIMEOUT = 20.0
NOTICE_DIR, _, NOTICE_NAME = DEFAULT_NOTICE_FILE.rpartition("/")
_spawn_lock = threading.Lock()  # terraform creates VMs in parallel: one port pick + spawn at a time


def _start_time(pid: int) -> str | None:
    """Process start time (clock ticks since boot), so a reused PID is not mistaken for our VM."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _keygen(path: Path) -> str:
    """A fresh ed25519 host key pair; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    pub = Path(f"{path}.pub").read_text().split()
    return f"{pub[0]} {pub[1]}"


# Paths a local VM does not share with the host: its own /root, tmpfs /tmp and /run, /dev/shm.
_MASKED = tuple(Path(p) for p in ("/root", "/tmp", "/run", "/dev/shm"))


def _readonly_binds() -> list[str]:
    """Host trees the VM sees live and read-only: the project and its venv (always: the overlay's
    lower layer must not change under a mounted overlay, and the code does change while VMs run),
    and the interpreter the venv links to when the VM would not see it (pyenv lives under /root)."""
    base = Path(os.path.realpath(sys.base_prefix))
    wanted = [Path(__file__).resolve().parents[2], Path(sys.prefix)]
    if any(base.is_relative_to(m) for m in _MASKED):
        wanted.append(base)
    out: list[str] = []
    for path in wanted:
        if not any(path.is_relative_to(o) for o in out):
            out.append(str(path))
    return out


class LocalBackend:
    """Backend `local`: needs root (namespaces), openssh-server and fuse3."""

    name = "local"
    credentials_expire = False

    def __init__(self, home: Path) -> None:
        self.home = home
        self.vms_dir = home / "vms"
        self.bucket_server = LocalBucket(home)

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        return {"vm_count": vm_count, "name_prefix": name_prefix, "gpu_type": "none",
                "ssh_public_key": ssh_public_key}

    # -- VMs ---------------------------------------------------------------------------------
    def _vm_dir(self, vm_id: str) -> Path:
        if not vm_id or "/" in vm_id or vm_id.startswith("."):
            raise GlueError(f"invalid local VM id {vm_id!r}")
        return self.vms_dir / vm_id

    def create_vm(self, spec: VMSpec) -> VMRecord:
        if spec.gpu_type != "none" or spec.gpu_count:
            raise GlueError("the local backend has no GPUs: set gpu_type = \"none\" and gpu_count = 0")
        for binary in ("/usr/sbin/sshd", shutil.which("unshare") or "/usr/bin/unshare"):
            if not Path(binary).exists():
                raise GlueError(f"{binary} is missing; run `make bootstrap` (installs openssh-server, util-linux)")
        vm_id = f"{spec.name}-{secrets.token_hex(4)}"
        vm_dir = self._vm_dir(vm_id)
        vm_dir.mkdir(parents=True)
        try:
            return self._boot(vm_id, vm_dir, spec)
        except BaseException:
            self._teardown(vm_dir)
            raise

    def _boot(self, vm_id: str, vm_dir: Path, spec: VMSpec) -> VMRecord:
        key_path = vm_dir / "ssh_host_ed25519_key"
        host_key = _keygen(key_path)
        with _spawn_lock:
            port = free_port()
            write_secret(
                vm_dir / "config.json",
                json.dumps(
                    {
                        "name": spec.name,
                        "port": port,
                        "authorized_key": spec.ssh_public_key,
                        "host_key_private_hex": key_path.read_bytes().hex(),
                        "readonly_binds": _readonly_binds(),
                    }
                ),
            )
            key_path.unlink()
            log = open(vm_dir / "init.log", "ab")
            proc = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child",
                 sys.executable, "-m", "glue.cloud.local.vm_init", str(vm_dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                cwd="/", env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
            )
            log.close()
            init_pid = None
            deadline = time.monotonic() + BOOT_TIMEOUT
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    tail = (vm_dir / "init.log").read_text(errors="replace").strip().splitlines()[-3:]
                    hint = " ".join(tail) or f"unshare exited {proc.returncode}"
                    if "Operation not permitted" in hint:
                        hint += " (creating namespaces needs root or CAP_SYS_ADMIN; run as root)"
                    raise GlueError(f"local VM {spec.name} failed to boot: {hint}")
                init_pid = init_pid or next(iter(_children(proc.pid)), None)
                if init_pid and ssh_banner(port):
                    break
                time.sleep(0.05)
            else:
                raise GlueError(
                    f"local VM {spec.name}: sshd did not answer on {HOST}:{port} within {BOOT_TIMEOUT:.0f}s"
                )
        state = {"id": vm_id, "name": spec.name, "port": port, "host_key": host_key,
                 "unshare_pid": proc.pid, "init_pid": init_pid, "init_start": _start_time(init_pid or 0)}
        (vm_dir / "state.json").write_text(json.dumps(state))
        return self._record(state, "running")

    @staticmethod
    def _record(state: dict[str, object], status: str) -> VMRecord:
        return VMRecord(
            id=str(state["id"]), name=str(state["name"]), ssh_host=HOST, ssh_port=int(str(state["port"])),
            ssh_user="root", host_key=str(state["host_key"]), gpu_type="none", gpu_count=0,
            backend="local", status=status,
        )

    def _state(self, vm_dir: Path) -> dict[str, object] | None:
        try:
            return dict(json.loads((vm_dir / "state.json").read_text()))
        except (OSError, ValueError):
            return None

    def _init_alive(self, state: dict[str, object]) -> bool:
        pid = int(str(state.get("init_pid") or 0))
        return pid > 0 and pid_alive(pid) and _start_time(pid) == state.get("init_start")

    def read_vm(self, vm_id: str) -> VMRecord | None:
        vm_dir = self._vm_dir(vm_id)
        state = self._state(vm_dir)
        if state is None or not (vm_dir / "disk").is_dir() or not self._init_alive(state):
            if vm_dir.exists():
                # Terminated out of band: like a cloud, its disk does not survive it.
                self._teardown(vm_dir)
            return None
        return self._record(state, "running")

    def list_vms(self) -> list[VMRecord]:
        if not self.vms_dir.is_dir():
            return []
        found = (self.read_vm(p.name) for p in sorted(self.vms_dir.iterdir()) if p.is_dir())
        return [r for r in found if r is not None]

    def owned_vm_ids(self) -> list[str]:
        return sorted(p.name for p in self.vms_dir.iterdir() if p.is_dir()) if self.vms_dir.is_dir() else []

    def delete_vm(self, vm_id: str) -> None:
        self._teardown(self._vm_dir(vm_id))

    def announce_termination(self, vm_id: str, grace_s: float) -> None:
        """As a cloud reclaims a VM: the notice file appears inside the VM (its tmpfs /run, reached through
        PID 1's root), `grace_s` later the VM is deleted. Blocks for the grace period."""
        state = self._state(self._vm_dir(vm_id))
        if state is None or not self._init_alive(state):
            raise GlueError(f"VM {vm_id} is gone; there is nothing to announce")
        run_dir = Path(f"/proc/{int(str(state['init_pid']))}/root{NOTICE_DIR}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / NOTICE_NAME).write_text(json.dumps({"action": "terminate", "grace_seconds": grace_s,
                                                       "at": time.time()}))
        time.sleep(grace_s)
        self.delete_vm(vm_id)

    def _teardown(self, vm_dir: Path) -> None:
        state = self._state(vm_dir) or {}
        pids = []
        if self._init_alive(state):
            pids.append(int(str(state["init_pid"])))
        unshare_pid = int(str(state.get("unshare_pid") or 0))
        if unshare_pid and pid_alive(unshare_pid):
            pids.extend(_children(unshare_pid))
            pids.append(unshare_pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(vm_dir, ignore_errors=True)
        # An image machine's own cgroups (whichever kind of local VM the caller thinks it is).
        cgroups = state.get("cgroups")
        vm_cgroup.remove([str(c) for c in cgroups] if isinstance(cgroups, list) else [])
        if vm_dir.exists():
            raise GlueError(f"could not remove {vm_dir}; a process may still hold it (check `fuser -vm {vm_dir}`)")

    # -- bucket ------------------------------------------------------------------------------
    def bucket(self) -> BucketInfo:
        return self.bucket_server.ensure_running()

    def bucket_credentials(self) -> BucketCredentials:
        return self.bucket_server.credentials()

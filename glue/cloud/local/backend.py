"""The local backend: VMs that boot the baked gpukit image on this machine, the bucket as rclone serve s3.

A VM = a `systemd-nspawn --boot` machine (glue.cloud.local.nspawn) with systemd as PID 1, on an
overlay whose lower layer is the cached image and whose upper layer is the VM's disk directory; its
own cgroup (glue.cloud.local.vm_cgroup) holds its memory/CPU limits. Nothing of the host is visible
inside but /dev/fuse, and its environment holds nothing of the controller's. Delete = SIGKILL the
machine's PID 1 and nspawn (the private mount namespace and its mounts go with them), then remove
the disk directory and the cgroup.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.checks import Readiness, host_readiness
from glue.cloud.local import host, nspawn, vm_cgroup
from glue.cloud.local.bucket import HOST, LocalBucket, free_port
from glue.errors import GlueError, NoCapacity
from glue.images import build, recipe
from glue.images.cache import Image
from glue.process import children, pid_alive, start_time
from glue.train.run.notice import DEFAULT_NOTICE_FILE

IMAGE = "gpukit"
# The VM's size: a CPU quota and a memory limit on its cgroup (unset: unlimited). Terraform variables
# `cpu` / `memory_gb`, as on the clouds; a change replaces the VMs.
SIZE_ENV = {"cpu": ("GPUKIT_VM_CPUS", 256), "memory_gb": ("GPUKIT_VM_MEMORY_GB", 4096)}
# A cloud without capacity, on this machine: at most this many VMs exist at once (unset: no limit).
CAPACITY_ENV = "GPUKIT_LOCAL_CAPACITY"
NOTICE_DIR, _, NOTICE_NAME = DEFAULT_NOTICE_FILE.rpartition("/")
_spawn_lock = threading.Lock()  # terraform creates VMs in parallel: one port pick + spawn at a time


class LocalBackend:
    """Backend `local`: needs root (namespaces, cgroups), systemd-container, /dev/fuse and (to bake) mmdebstrap.

    VMs boot the `gpukit` image (`glue image build`; baked on first use)."""

    name = "local"
    credentials_expire = False
    bucket_on_host = True
    baked_image: str | None = "tree"
    multi_node: str | None = None
    takes_config_seed = True
    deletes_vms = True

    def check_host(self) -> None:
        host.check()

    def readiness(self) -> Readiness:
        return host_readiness("local VMs", self.check_host, "systemd-nspawn, FUSE and mount namespaces are available")

    def __init__(self, home: Path) -> None:
        self.home = home
        self.vms_dir = home / "vms"
        self.bucket_server = LocalBucket(home)

    def spares_problem(self) -> str | None:
        return None  # a VM here waits idle as long as it is asked to

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        tfv: dict[str, Any] = {"vm_count": vm_count, "name_prefix": name_prefix, "gpu_type": "none",
                               "ssh_public_key": ssh_public_key}
        for var, (env, most) in SIZE_ENV.items():
            raw = os.environ.get(env, "").strip()
            if not raw:
                continue
            if not raw.isdigit() or not 1 <= int(raw) <= most:
                raise GlueError(f"{env}={raw!r}: use a whole number from 1 to {most}, or unset it for no limit")
            tfv[var] = int(raw)
        return tfv

    def image(self) -> Image:
        return build.build(recipe.load(IMAGE), self.home)[0]

    # -- VMs ---------------------------------------------------------------------------------
    def _vm_dir(self, vm_id: str) -> Path:
        if not vm_id or "/" in vm_id or vm_id.startswith("."):
            raise GlueError(f"invalid local VM id {vm_id!r}")
        return self.vms_dir / vm_id

    def create_vm(self, spec: VMSpec) -> VMRecord:
        if spec.gpu_type != "none" or spec.gpu_count:
            raise GlueError("the local backend has no GPUs: set gpu_type = \"none\" and gpu_count = 0")
        nspawn.check_tools()
        self._check_capacity()
        vm_id = f"{spec.name}-{secrets.token_hex(4)}"
        vm_dir = self._vm_dir(vm_id)
        vm_dir.mkdir(parents=True)
        try:
            return self._boot(vm_id, vm_dir, spec)
        except BaseException:
            self._teardown(vm_dir)
            raise

    def _check_capacity(self) -> None:
        raw = os.environ.get(CAPACITY_ENV, "").strip()
        if not raw:
            return
        if not raw.isdigit():
            raise GlueError(f"{CAPACITY_ENV}={raw!r}: use a whole number of VMs, or unset it for no limit")
        have = len(list(self.vms_dir.iterdir())) if self.vms_dir.is_dir() else 0
        if have >= int(raw):
            raise NoCapacity(f"no capacity: {have} local VMs exist and {CAPACITY_ENV}={raw} (as a cloud with no "
                             "free machine answers)")

    def _boot(self, vm_id: str, vm_dir: Path, spec: VMSpec) -> VMRecord:
        image = self.image()
        # The VM's own cgroup (its memory/CPU limits; the root of its cgroup namespace), recorded before
        # the boot so a failed boot's teardown removes it too.
        cgroups = vm_cgroup.create(vm_id, limits_of(spec))
        booting: dict[str, object] = {"id": vm_id, "cgroups": [str(p) for p in cgroups]}
        (vm_dir / "state.json").write_text(json.dumps(booting))

        def spawned(pid: int) -> None:  # recorded at once: a teardown after an interrupted boot stops it
            (vm_dir / "state.json").write_text(json.dumps({**booting, "unshare_pid": pid}))

        with _spawn_lock:  # one port pick + boot at a time: terraform creates VMs in parallel
            port = free_port()
            nspawn.write_seed(vm_dir / "seed", spec.name, port, spec.ssh_public_key,
                              Path(spec.config_seed) if spec.config_seed else None)
            machine = nspawn.boot(spec.name, image.rootfs, vm_dir, port, cgroups, on_spawn=spawned)
        vm_cgroup.delegate(machine.init_pid)
        # `unshare_pid` is the nspawn process, `init_pid` the machine's PID 1 (its start time guards
        # against a reused PID).
        state = {"id": vm_id, "name": spec.name, "port": port, "host_key": machine.host_key,
                 "unshare_pid": machine.nspawn_pid, "init_pid": machine.init_pid,
                 "init_start": start_time(machine.init_pid), "image": f"{image.name}-{image.hash[:16]}",
                 "cgroups": [str(p) for p in cgroups]}
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
        return pid > 0 and pid_alive(pid) and start_time(pid) == state.get("init_start")

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
        launched = {unshare_pid} if unshare_pid and pid_alive(unshare_pid) else set()
        for pid in sorted(launched | set(nspawn.launched_for(vm_dir))):
            pids.extend(children(pid))  # the machine's PID 1 among them: its whole PID namespace goes with it
            pids.append(pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(vm_dir, ignore_errors=True)
        # The VM's own cgroups.
        cgroups = state.get("cgroups")
        vm_cgroup.remove([str(c) for c in cgroups] if isinstance(cgroups, list) else [])
        if vm_dir.exists():
            raise GlueError(f"could not remove {vm_dir}; a process may still hold it (check `fuser -vm {vm_dir}`)")

    # -- bucket ------------------------------------------------------------------------------
    def bucket(self) -> BucketInfo:
        return self.bucket_server.ensure_running()

    def bucket_credentials(self) -> BucketCredentials:
        return self.bucket_server.credentials()


def limits_of(spec: VMSpec) -> vm_cgroup.Limits:
    """The VM's size where the spec asks for one (`cpu`, `memory_gb`); else unlimited."""
    return vm_cgroup.Limits(memory_mb=int(getattr(spec, "memory_gb", 0) or 0) * 1024,
                            cpus=int(getattr(spec, "cpu", 0) or 0))

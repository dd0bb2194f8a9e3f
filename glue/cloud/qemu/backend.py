"""Backend `qemu`: full VMs with their own kernel, booted from the baked gpukit image (glue.cloud.qemu.vm).

A VM lives in `<home>/qemu/vms/<id>/`: its qcow2 overlay (`disk/overlay.qcow2`, over the image's
cached boot disk), its seed disk, its serial console log and `state.json`. The bucket is the local
backend's (`rclone serve s3` on the host's loopback), reached from the guest through qemu's
guestfwd; its endpoint and the outputs contract are the local backend's. A VM whose qemu process is
gone (killed, crashed) reads as gone and its disk is removed, as a cloud's terminated VM: the next
`glue up` replaces it with a fresh one.
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
from glue.cloud.local.bucket import HOST, LocalBucket, free_port
from glue.cloud.qemu import vm
from glue.errors import GlueError
from glue.images import build, disk, docker_seed, recipe
from glue.process import pid_alive, start_time

IMAGE = "gpukit"
# terraform creates VMs (and reads the bucket) in parallel threads of one provider process: one
# port pick + launch, and one bucket start, at a time.
_lock = threading.Lock()


class QemuBackend:
    """Backend `qemu`: needs qemu-system-x86, qemu-utils, socat, e2fsprogs (and mmdebstrap to bake)."""

    name = "qemu"
    credentials_expire = False
    bucket_on_host = True
    baked_image: str | None = "disk"
    multi_node: str | None = "qemu VMs cannot reach each other (user-mode networking, see docs/qemu.md)"
    takes_config_seed = True  # on the seed disk, beside meta-data (glue.operations.vm_seed)
    deletes_vms = True

    def check_host(self) -> None:
        vm.check_tools()
        docker_seed.check_tools()  # the boot disk's Docker base is imported in a systemd-nspawn container

    def readiness(self) -> Readiness:
        return host_readiness("qemu VMs", self.check_host,
                              "qemu, qemu-img, socat, mke2fs and systemd-nspawn are installed")

    def __init__(self, home: Path) -> None:
        self.home = home
        self.vms_dir = home / "qemu" / "vms"
        self.bucket_server = LocalBucket(home)

    def spares_problem(self) -> str | None:
        return None  # a VM here waits idle as long as it is asked to

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        return {"vm_count": vm_count, "name_prefix": name_prefix, "gpu_type": "none",
                "ssh_public_key": ssh_public_key}

    def boot_disk(self) -> disk.BootDisk:
        image, _ = build.build(recipe.load(IMAGE), self.home)
        return disk.boot_disk(image)

    # -- VMs ---------------------------------------------------------------------------------
    def _vm_dir(self, vm_id: str) -> Path:
        if not vm_id or "/" in vm_id or vm_id.startswith("."):
            raise GlueError(f"invalid qemu VM id {vm_id!r}")
        return self.vms_dir / vm_id

    def create_vm(self, spec: VMSpec) -> VMRecord:
        if spec.gpu_type != "none" or spec.gpu_count:
            raise GlueError("the qemu backend has no GPUs: set gpu_type = \"none\" and gpu_count = 0")
        vm.check_tools()
        boot = self.boot_disk()
        bucket_port = int(self.bucket().endpoint.rsplit(":", 1)[1])
        vm_id = f"{spec.name}-{secrets.token_hex(4)}"
        vm_dir = self._vm_dir(vm_id)
        (vm_dir / "disk").mkdir(parents=True)
        try:
            return self._boot(vm_id, vm_dir, spec, boot, bucket_port)
        except BaseException:
            self._teardown(vm_dir)
            raise

    def _boot(self, vm_id: str, vm_dir: Path, spec: VMSpec, boot: disk.BootDisk, bucket_port: int) -> VMRecord:
        overlay, seed, console = vm_dir / "disk" / "overlay.qcow2", vm_dir / "seed.img", vm_dir / "console.log"
        vm.make_overlay(boot.disk, overlay)
        vm.write_seed_disk(seed, vm.meta_data(spec.name, bucket_port), spec.ssh_public_key,
                           Path(spec.config_seed) if spec.config_seed else None)
        log = vm_dir / "qemu.log"
        with _lock:  # until qemu holds the port it was given
            port = free_port()
            proc = vm.start(spec.name, vm.command(spec.name, boot, overlay, seed, console, port, bucket_port),
                            port, log)
        # LocalBackend's shape (the qemu process as both unshare_pid and init_pid): a kit home's cleanup
        # that only knows LocalBackend still kills it. Written before the boot, so a failed one is torn down.
        state: dict[str, object] = {
            "id": vm_id, "name": spec.name, "port": port, "host_key": "", "unshare_pid": proc.pid,
            "init_pid": proc.pid, "init_start": start_time(proc.pid), "bucket_port": bucket_port,
            "disk": str(boot.disk)}
        (vm_dir / "state.json").write_text(json.dumps(state))
        state["host_key"] = vm.wait_booted(spec.name, proc, console, port, log)
        (vm_dir / "state.json").write_text(json.dumps(state))
        return self._record(state, "running")

    @staticmethod
    def _record(state: dict[str, object], status: str) -> VMRecord:
        return VMRecord(
            id=str(state["id"]), name=str(state["name"]), ssh_host=HOST, ssh_port=int(str(state["port"])),
            ssh_user="root", host_key=str(state["host_key"]), gpu_type="none", gpu_count=0,
            backend="qemu", status=status,
        )

    @staticmethod
    def _state(vm_dir: Path) -> dict[str, object] | None:
        try:
            return dict(json.loads((vm_dir / "state.json").read_text()))
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(state: dict[str, object]) -> bool:
        pid = int(str(state.get("init_pid") or 0))
        return pid > 0 and pid_alive(pid) and start_time(pid) == state.get("init_start")

    def qemu_pid(self, vm_id: str) -> int | None:
        """The VM's qemu process while it runs (tests and drills kill it)."""
        state = self._state(self._vm_dir(vm_id))
        return int(str(state["init_pid"])) if state is not None and self._alive(state) else None

    def read_vm(self, vm_id: str) -> VMRecord | None:
        vm_dir = self._vm_dir(vm_id)
        state = self._state(vm_dir)
        if state is None or not (vm_dir / "disk" / "overlay.qcow2").is_file() or not self._alive(state):
            if vm_dir.exists():
                self._teardown(vm_dir)  # terminated out of band: like a cloud, its disk does not survive it
            return None
        return self._record(state, "running")

    def owned_vm_ids(self) -> list[str]:
        return sorted(p.name for p in self.vms_dir.iterdir() if p.is_dir()) if self.vms_dir.is_dir() else []

    def delete_vm(self, vm_id: str) -> None:
        self._teardown(self._vm_dir(vm_id))

    def _teardown(self, vm_dir: Path) -> None:
        state = self._state(vm_dir) or {}
        if self._alive(state):
            pid = int(str(state["init_pid"]))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        shutil.rmtree(vm_dir, ignore_errors=True)
        if vm_dir.exists():
            raise GlueError(f"could not remove {vm_dir}; a process may still hold it (check `fuser -vm {vm_dir}`)")

    # -- bucket ------------------------------------------------------------------------------
    def bucket(self) -> BucketInfo:
        with _lock:
            return self.bucket_server.ensure_running()

    def bucket_credentials(self) -> BucketCredentials:
        return self.bucket_server.credentials()

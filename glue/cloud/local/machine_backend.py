"""The local backend with VMs that boot the baked image (systemd-nspawn machines, glue.cloud.local.nspawn).

Same bucket, records and lifecycle as LocalBackend; only how a VM boots differs. Its state.json
keeps LocalBackend's shape (the nspawn process as `unshare_pid`, the machine's PID 1 as `init_pid`),
so reading a VM (gone when its PID 1 or its disk is) and deleting it (SIGKILL PID 1 and nspawn,
remove the disk) are LocalBackend's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local import nspawn, vm_cgroup
from glue.cloud.local.backend import LocalBackend, _spawn_lock, _start_time
from glue.cloud.local.bucket import free_port
from glue.errors import GlueError
from glue.images import build, recipe
from glue.images.cache import Image

IMAGE = "gpukit"
# The VM's size: a CPU quota and a memory limit on its cgroup (unset: unlimited). Terraform variables
# `cpu` / `memory_gb`, as on the clouds; a change replaces the VMs.
SIZE_ENV = {"cpu": ("GPUKIT_VM_CPUS", 256), "memory_gb": ("GPUKIT_VM_MEMORY_GB", 4096)}


class MachineBackend(LocalBackend):
    """Backend `local`, VMs booted from the `gpukit` image (`glue image build`; baked on first use)."""

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        tfv = super().tf_vars(vm_count, name_prefix, ssh_public_key)
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

    def _boot(self, vm_id: str, vm_dir: Path, spec: VMSpec) -> VMRecord:
        nspawn.check_tools()
        image = self.image()
        # The VM's own cgroup (its memory/CPU limits; the root of its cgroup namespace), recorded before
        # the boot so a failed boot's teardown removes it too.
        cgroups = vm_cgroup.create(vm_id, limits_of(spec))
        (vm_dir / "state.json").write_text(json.dumps({"id": vm_id, "cgroups": [str(p) for p in cgroups]}))
        with _spawn_lock:  # one port pick + boot at a time: terraform creates VMs in parallel
            port = free_port()
            nspawn.write_seed(vm_dir / "seed", spec.name, port, spec.ssh_public_key)
            machine = nspawn.boot(spec.name, image.rootfs, vm_dir, port, cgroups)
        vm_cgroup.delegate(machine.init_pid)
        state = {"id": vm_id, "name": spec.name, "port": port, "host_key": machine.host_key,
                 "unshare_pid": machine.nspawn_pid, "init_pid": machine.init_pid,
                 "init_start": _start_time(machine.init_pid), "image": f"{image.name}-{image.hash[:16]}",
                 "cgroups": [str(p) for p in cgroups]}
        (vm_dir / "state.json").write_text(json.dumps(state))
        return self._record(state, "running")


def limits_of(spec: VMSpec) -> vm_cgroup.Limits:
    """The VM's size where the spec asks for one (`cpu`, `memory_gb`); else unlimited."""
    return vm_cgroup.Limits(memory_mb=int(getattr(spec, "memory_gb", 0) or 0) * 1024,
                            cpus=int(getattr(spec, "cpu", 0) or 0))

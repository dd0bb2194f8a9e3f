"""The local backend with VMs that boot the baked image (systemd-nspawn machines, glue.cloud.local.nspawn).

Same bucket, records and lifecycle as LocalBackend; only how a VM boots differs. Its state.json
keeps LocalBackend's shape (the nspawn process as `unshare_pid`, the machine's PID 1 as `init_pid`),
so reading a VM (gone when its PID 1 or its disk is) and deleting it (SIGKILL PID 1 and nspawn,
remove the disk) are LocalBackend's own.
"""

from __future__ import annotations

import json
from pathlib import Path

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local import nspawn
from glue.cloud.local.backend import LocalBackend, _spawn_lock, _start_time
from glue.cloud.local.bucket import free_port
from glue.images import build, recipe
from glue.images.cache import Image

IMAGE = "gpukit"


class MachineBackend(LocalBackend):
    """Backend `local`, VMs booted from the `gpukit` image (`glue image build`; baked on first use)."""

    def image(self) -> Image:
        return build.build(recipe.load(IMAGE), self.home)[0]

    def _boot(self, vm_id: str, vm_dir: Path, spec: VMSpec) -> VMRecord:
        nspawn.check_tools()
        image = self.image()
        with _spawn_lock:  # one port pick + boot at a time: terraform creates VMs in parallel
            port = free_port()
            nspawn.write_seed(vm_dir / "seed", spec.name, port, spec.ssh_public_key)
            machine = nspawn.boot(spec.name, image.rootfs, vm_dir, port)
        state = {"id": vm_id, "name": spec.name, "port": port, "host_key": machine.host_key,
                 "unshare_pid": machine.nspawn_pid, "init_pid": machine.init_pid,
                 "init_start": _start_time(machine.init_pid), "image": f"{image.name}-{image.hash[:16]}"}
        (vm_dir / "state.json").write_text(json.dumps(state))
        return self._record(state, "running")

"""qemu VMs (the baked image with its own kernel, TCG) against the local backend's VMs (the same image
as systemd-nspawn machines), measured in the same run.

    .venv/bin/python bench/qemu.py [--rounds 1] [--json bench/out/qemu.json]

Prints: boot-to-SSH of one VM of each kind (median of --rounds; the image and its boot disk are made
before the timing) and their ratio qemu / local machine; for one qemu VM: converge fresh and the no-op
re-run; a second VM booted with the configuration seed captured from the first, until it configured
itself (its key and its mount checked) against the first's boot plus fresh converge; and a reboot (the
nvidia_driver role's reboot task) until SSH answers and /mnt/s3 is mounted again by its unit. Timings
on a shared, busy 2-core host are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from path_check import expect  # bench/path_check.py

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.qemu.backend import QemuBackend
from glue.images import recipe
from glue.infra import ansible_run, inventory, ssh
from glue.infra.ansible_run import ANSIBLE_DIR
from glue.infra.ssh_keys import public_key
from glue.operations import convergence, vm_seed
from glue.paths import PROJECT_ROOT
from tests.testbed import LocalTestbed

REBOOT_PLAY = """\
- name: Reboot (the nvidia_driver role's reboot task)
  hosts: all
  gather_facts: false
  tasks:
    - name: Reboot
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: reboot.yml
      vars:
        nvidia_driver_reboot_timeout: 900
"""


def machine_boot(tmp: Path, rounds: int) -> float:
    times = []
    for i in range(rounds):
        bed = LocalTestbed(tmp / f"machine-{i}")
        try:
            bed.backend.bucket()  # outside the timing
            t = time.monotonic()
            bed.create(1)
            times.append(time.monotonic() - t)
        finally:
            for vm_id in bed.backend.owned_vm_ids():
                bed.backend.delete_vm(vm_id)
            bed.backend.bucket_server.stop()
    return statistics.median(times)


def qemu_boot(backend: QemuBackend, home: Path) -> tuple[float, dict[str, VMRecord]]:
    t = time.monotonic()
    rec = backend.create_vm(VMSpec("gpukit-1", "none", 0, 10, public_key(home)))
    seconds = time.monotonic() - t
    return seconds, {"gpukit-1": rec}


def seeded_vm(backend: QemuBackend, home: Path, vms: dict[str, VMRecord],
              out: dict[str, float]) -> tuple[float, float]:
    """A second VM of the converged configuration: booted with the seed captured from the first, until it
    configured itself (glue.operations.vm_seed.configured: its key, its mount live), against the first VM's
    boot plus its fresh converge. The seeded VM is removed again."""
    image = recipe.load("gpukit").content_hash()
    host = inventory.hosts_from_outputs(inventory.outputs_of(vms, backend.bucket()))[0]
    taken = vm_seed.capture(home, host, convergence.vm_parts(home, image)[host.name])
    expect("playbook", "playbook" if taken else "seed (it had applied a seed at first boot: no capture)",
           f"{host.name}, the seed's source")
    t = time.monotonic()
    rec = backend.create_vm(VMSpec("gpukit-2", "none", 0, 10, public_key(home), str(vm_seed.seed_path(home))))
    both = {**vms, "gpukit-2": rec}
    inventory.write(home, inventory.outputs_of(both, backend.bucket()))
    hosts = inventory.hosts_from_outputs(inventory.outputs_of(both, backend.bucket()))
    new = [h for h in hosts if h.name == "gpukit-2"]
    seeded = vm_seed.configured(home, new, convergence.vm_parts(home, image)) == ["gpukit-2"]
    expect("seed", "seed" if seeded else "none (its key or its mount check failed)", "the seeded VM gpukit-2")
    seconds = time.monotonic() - t
    backend.delete_vm(rec.id)
    inventory.write(home, inventory.outputs_of(vms, backend.bucket()))
    return round(seconds, 1), round(out["boot_to_ssh_qemu_s"] + out["converge_fresh_s"], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("GPUKIT_IMAGES", str(PROJECT_ROOT / ".gpukit" / "images"))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-qemu-") as tmpdir:
        tmp = Path(tmpdir)
        home = tmp / "qemu"
        home.mkdir()
        backend = QemuBackend(home)
        backend.boot_disk()  # image + boot disk: cached, outside the timing
        backend.bucket()
        backend.bucket_credentials()
        try:
            qemu_times = []
            vms: dict[str, VMRecord] = {}
            for _ in range(args.rounds):
                seconds, vms = qemu_boot(backend, home)
                qemu_times.append(seconds)
                if len(qemu_times) < args.rounds:
                    for vm_id in backend.owned_vm_ids():
                        backend.delete_vm(vm_id)
            out["boot_to_ssh_qemu_s"] = round(statistics.median(qemu_times), 1)
            out["boot_to_ssh_machine_s"] = round(machine_boot(tmp, args.rounds), 2)
            inventory.write(home, inventory.outputs_of(vms, backend.bucket()))
            for key in ("converge_fresh_s", "converge_noop_s"):
                result = ansible_run.converge(home, progress=False)
                assert result.ok, result.failed
                out[key] = round(result.seconds, 1)
                if key == "converge_noop_s":
                    assert set(result.changed.values()) == {0}, result.changed
            out["seeded_vm_s"], out["playbook_vm_s"] = seeded_vm(backend, home, vms, out)
            (tmp / "reboot.yml").write_text(REBOOT_PLAY)
            (tmp / "group_vars").symlink_to(ANSIBLE_DIR / "group_vars")  # the pinned host keys
            t = time.monotonic()
            result = ansible_run.run_playbook(str(tmp / "reboot.yml"), home, progress=False)
            assert result.ok, result.failed
            host = inventory.hosts_from_outputs(inventory.outputs_of(vms, backend.bucket()))[0]
            mounted = ssh.run(home, host, "systemctl is-system-running --wait >/dev/null; "
                                          "until systemctl is-active -q gpukit-mount.service; do sleep 0.5; done; "
                                          "findmnt -n -o FSTYPE /mnt/s3", timeout=600)
            assert mounted.stdout.strip() == "fuse.rclone", mounted
            out["reboot_to_mounted_s"] = round(time.monotonic() - t, 1)
        finally:
            for vm_id in backend.owned_vm_ids():
                backend.delete_vm(vm_id)
            backend.bucket_server.stop()
    ratio = out["boot_to_ssh_qemu_s"] / out["boot_to_ssh_machine_s"]
    print(f"boot to SSH: qemu {out['boot_to_ssh_qemu_s']} s, local machine {out['boot_to_ssh_machine_s']} s "
          f"(ratio qemu/machine {ratio:.1f})")
    print(f"qemu converge: fresh {out['converge_fresh_s']} s, no-op {out['converge_noop_s']} s (changed=0)")
    print(f"qemu reboot until /mnt/s3 is mounted again: {out['reboot_to_mounted_s']} s")
    print(f"a new qemu VM configured: from the seed {out['seeded_vm_s']} s (boot, its key and mount checked), with "
          f"the playbook {out['playbook_vm_s']} s (boot + fresh converge): "
          f"{out['seeded_vm_s'] / out['playbook_vm_s']:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**out, "ratio_qemu_over_machine": round(ratio, 1)}, indent=1))


if __name__ == "__main__":
    main()

"""The qemu tests: what only a full VM shows. make test boots the baked image (the first test); the whole
scenario (`stress`, make test-all): made by the real `glue up --backend qemu` (terraform, the gpukit provider)
and configured by the real site.yml, the trainer role in image mode: the trainer's Docker base came on the
boot disk (imported natively when the disk was made), images/trainer/Dockerfile.offline adds the gpukit wheel
on the VM, offline. /mnt/s3 is mounted by its systemd unit through the guest's loopback forwarder to the
host's bucket, Docker runs, the nvidia_driver role's reboot brings the mount back; a `runtime: docker` run of
tiny_gpt by `glue deploy` writes its checkpoints through /mnt/s3 and completes; `glue down` removes the VM. (A
qemu killed out of band reads as gone with its disk: tests/unit/test_qemu_backend.py, without a boot.)
Recovery (onto a new VM, or `--same-vm` without a playbook) is the same code on every backend and the local
e2e tests prove it; a docker attempt's restart is one more `docker run` of a new container name
(glue/runs/docker_run.py). Under emulation a recovery cost ~75 s of this test (a container start and `import
torch`), so it is not repeated here. A second converge that changes nothing (~35 s under emulation) is make
test-all's (the stress test below). Phase times are printed (pytest -s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from glue.cloud.qemu.backend import QemuBackend
from glue.infra import ansible_run
from glue.infra.ansible_run import ANSIBLE_DIR
from glue.operations import vm_seed
from glue.runs.store import RunStore
from tests.integration.test_runs import run_config, status
from tests.kit import Kit

pytestmark = pytest.mark.integration

REBOOT_PLAY = """\
- name: Reboot through the nvidia_driver role's reboot (as after a driver change)
  hosts: all
  gather_facts: false
  tasks:
    - name: Reboot
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: reboot.yml
      vars:
        nvidia_driver_reboot_timeout: 600
"""


def _on_vm(kit: Kit, script: str) -> list[str]:
    return kit.glue("ssh", "gpukit-1", "sh", "-c", script, timeout=180).stdout.split()


def reboot_and_check_mount(kit: Kit, tmp_path: Path, boot_id: str) -> None:
    """The nvidia_driver role's reboot; the VM comes back (a new boot id) with /mnt/s3 mounted by its unit."""
    (tmp_path / "reboot.yml").write_text(REBOOT_PLAY)
    if not (tmp_path / "group_vars").exists():
        (tmp_path / "group_vars").symlink_to(ANSIBLE_DIR / "group_vars")  # the pinned host keys
    rebooted = ansible_run.run_playbook(str(tmp_path / "reboot.yml"), kit.home, progress=False)
    assert rebooted.ok, rebooted
    after = _on_vm(kit, "systemctl is-system-running --wait >/dev/null; "
                        "systemctl is-active gpukit-mount.service; findmnt -n -o FSTYPE /mnt/s3; "
                        "cat /proc/sys/kernel/random/boot_id")
    assert after[:2] == ["active", "fuse.rclone"] and after[2] != boot_id, after


RUN = "qemu-docker"
# The trainer role in image mode, built offline: what a user puts in <home>/ansible/group_vars/all.yml
# (next to the inventory glue writes, so `glue up` and `glue recover` converge with it).
TRAINER_VARS = "trainer_image: gpukit-trainer:offline\ntrainer_image_source: build\n"


def _image_mode(kit: Kit) -> None:
    group_vars = kit.home / "ansible" / "group_vars"
    group_vars.mkdir(parents=True)
    (group_vars / "all.yml").write_text(TRAINER_VARS)


def _docker_run_config(tmp_path: Path) -> Path:
    return run_config(tmp_path, image="gpukit-trainer:offline", runtime="docker",
                      # A step of the reference config took ~1 min under emulation: the smallest model, and
                      # one checkpoint (every step and save is seconds here; more of them prove nothing qemu adds).
                      config={"steps": 4, "checkpoint_interval": 4, "step_sleep": 0.2, "batch_size": 2,
                              "seq_len": 16, "d_model": 16, "n_layer": 1, "n_head": 2},
                      checkpoint={"target": "/mnt/s3/runs/{run}", "interval_steps": 4},
                      # Under emulation a container's start and `import torch` take minutes, not a stall.
                      monitor={"heartbeat_seconds": 1, "stall_timeout_seconds": 900})


@pytest.mark.timeout(1800)  # a first boot is budgeted in CPU time (glue.cloud.qemu.vm): minutes of wall on a busy host
def test_qemu_vm_boots_its_own_kernel_with_the_docker_base_on_its_disk_and_goes(qemu_kit: Kit) -> None:
    """make test's qemu test: what `glue up --backend qemu` itself makes, without a converge under emulation
    (~1 min here against ~9 min and ~730 CPU-s for the whole scenario below, a third of the suite's CPU): the
    baked image booted by terraform and the gpukit provider with its own kernel and systemd, reached over SSH
    with its host key pinned, the trainer's Docker base already on its boot disk; `glue down` removes it."""
    kit = qemu_kit
    kit.glue("up", "--backend", "qemu", "--vms", "1", "--no-configure", timeout=1500)
    backend = QemuBackend(kit.home)
    assert len(backend.owned_vm_ids()) == 1
    init, own_kernel, repositories = _on_vm(kit, "cat /proc/1/comm; uname -r | grep -c cloud-amd64; grep -c "
                                                 "gpukit-base:vm /var/lib/docker/image/overlay2/repositories.json")
    assert (init, own_kernel, repositories) == ("systemd", "1", "1")
    kit.glue("down", timeout=300)
    assert backend.owned_vm_ids() == []


# `stress` (make test-all): the whole scenario under emulation, ~9 min and ~730 CPU-s on a 2-core host. make test
# boots the image (the test above); the playbook, the mount unit and its reboot run on local VMs in make test
# (tests/integration/test_ansible.py, the session cluster), and a `runtime: docker` attempt's command line is
# tests/unit/test_docker_argv.py's; only here do they meet Docker and a kernel of the VM's own.
@pytest.mark.stress
@pytest.mark.timeout(3600)  # ~5 min idle; every step in the guest is many times slower on a busy host
def test_qemu_vm_docker_run_reboot_complete_down(qemu_kit: Kit, tmp_path: Path) -> None:
    from glue.runs import monitor

    kit = qemu_kit
    seconds: dict[str, float] = {}
    t0 = time.monotonic()

    def lap(name: str, since: float) -> float:
        seconds[name] = round(time.monotonic() - since, 1)
        print(f"qemu e2e: {name} {seconds[name]} s", flush=True)
        return time.monotonic()

    _image_mode(kit)
    t = time.monotonic()
    kit.glue("up", "--backend", "qemu", "--vms", "1", "--no-configure", timeout=900)
    t = lap("up (boot to SSH)", t)
    backend = QemuBackend(kit.home)
    assert len(backend.owned_vm_ids()) == 1
    # The trainer's Docker base is on the boot disk before any converge (Docker is not even started yet).
    (disk_base,) = _on_vm(kit, "sed -n 's/.*\"gpukit-base:vm\":\"\\([^\"]*\\)\".*/\\1/p' "
                               "/var/lib/docker/image/overlay2/repositories.json")
    assert disk_base.startswith("sha256:"), disk_base
    first = kit.glue("up", timeout=1800).stderr  # up.yml: site.yml, then verify.yml; recorded as converged
    assert "terraform: nothing to change" in first and "converging gpukit-1: never configured" in first, first
    # Docker's storage (the trainer image just built) is not in a configuration seed: none is taken, and a
    # new VM is converged by the playbook (a qemu VM in the venv runtime takes one: test_qemu_seed.py).
    assert "no configuration seed: gpukit-1's trainer runs in the Docker image gpukit-trainer:offline" \
        in " ".join(first.split()), first
    assert vm_seed.current_key(kit.home) is None
    t = lap("glue up: site.yml + verify.yml, fresh VM (trainer image built offline)", t)

    checks = ("systemctl is-active gpukit-mount.service docker.service; findmnt -n -o FSTYPE /mnt/s3; "
              "cat /proc/1/comm; uname -r | grep -c cloud-amd64; cat /proc/sys/kernel/random/boot_id; "
              "docker image inspect --format '{{.Id}}' gpukit-trainer:offline gpukit-base:vm")
    active_mount, active_docker, fstype, init, own_kernel, boot_id, image_id, base_id = _on_vm(kit, checks)
    assert (active_mount, active_docker, fstype, init, own_kernel) == ("active", "active", "fuse.rclone",
                                                                       "systemd", "1")
    assert image_id.startswith("sha256:"), image_id
    assert base_id == disk_base  # the role built on the disk's base: no import under emulation

    # A second site.yml changes nothing: make test-all (test_qemu_image_mode_converges_again_with_no_change).
    t = time.monotonic()
    reboot_and_check_mount(kit, tmp_path, boot_id)
    t = lap("reboot until /mnt/s3 is mounted again", t)

    # runtime: docker, no GPU on the VM: no --gpus, the VM's network (the bucket forwarder on its loopback).
    kit.glue("deploy", "--run", RUN, "--config", str(_docker_run_config(tmp_path)), timeout=900)
    t_deployed = lap("glue deploy (preflight, start)", t)
    store = RunStore.open(kit.home, RUN)
    manifest = store.manifest()
    assert manifest["runtime"] == "docker" and manifest["image_digest"] == image_id, manifest
    assert store.attempt(1)["nodes"][0]["docker_gpus"] is False
    deadline = time.monotonic() + 1200
    while store.exit_record(1) is None:
        assert time.monotonic() < deadline, kit.glue("logs", "--run", RUN, check=False).stdout
        time.sleep(2)
    assert (store.exit_record(1) or {}).get("exit_code") == 0, store.exit_record(1)
    # The checkpoint was committed through the mount (the target is /mnt/s3/runs/{run}) and read back valid.
    assert monitor.last_valid_checkpoint(store, store.read_manifest()) == 4
    assert status(kit, RUN)["state"] == "completed"
    t = lap("deploy to completion (checkpoint 4 through /mnt/s3)", t_deployed)

    # A qemu killed out of band reads as gone, disk and all (tests/unit/test_qemu_backend.py), and `glue up`
    # replaces a gone VM with an empty one on any backend (tests/integration/test_cluster.py): no second
    # boot under emulation for that here.
    kit.glue("down", timeout=300)
    assert backend.owned_vm_ids() == []
    lap("whole test", t0)


# `stress` (make test-all): make test converges this image mode once under emulation (the test above) and re-runs
# site.yml with changed=0 on a local VM
# (tests/integration/test_ansible.py::test_supervisor_remounts_after_rclone_dies_and_refuses_writes_meanwhile);
# this adds the image mode's second pass: the trainer image is not built again, nothing changes.
@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_qemu_image_mode_converges_again_with_no_change(qemu_kit: Kit) -> None:
    kit = qemu_kit
    _image_mode(kit)
    kit.glue("up", "--backend", "qemu", "--vms", "1", timeout=1800)  # boot, site.yml + verify.yml
    inspect = "docker image inspect --format '{{.Id}}' gpukit-trainer:offline"
    (image_id,) = _on_vm(kit, inspect)
    again = ansible_run.converge(kit.home, progress=False)  # as `glue up` runs it (the wheel by source hash)
    assert again.ok and again.changed == {"gpukit-1": 0}, again
    assert _on_vm(kit, inspect) == [image_id]
    kit.glue("down", timeout=300)
    assert QemuBackend(kit.home).owned_vm_ids() == []

"""`runtime: docker`: the `docker run` of a trainer on a VM, and whether the VM's GPUs can be given to it."""

from __future__ import annotations

from pathlib import Path

from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import remote
from glue.train.run.notice import DEFAULT_NOTICE_FILE, NOTICE_FILE_ENV
from glue.train.workspace.paths import CONTAINER_WORKDIR

# True when the VM has an NVIDIA GPU the container can be given: the driver answers, or its device exists.
GPU_PROBE = "nvidia-smi -L >/dev/null 2>&1 || test -e /dev/nvidia0"


def docker_gpus(home: Path, host: Host) -> bool:
    """Whether `docker run` gets `--gpus all` on this VM: probed on the VM, not taken from the inventory (a
    GPU-less VM, e.g. qemu, has no NVIDIA runtime and docker refuses the flag there)."""
    return ssh.run(home, host, GPU_PROBE, timeout=30).exit_code == 0


def docker_argv(run: str, attempt: int, image: str, argv: list[str], env_file: str, gpus: bool = True,
                code_dir: str | None = None) -> list[str]:
    """`docker run` of the trainer (runtime: docker): the bucket mount, the credentials file (read-only,
    refreshed in place by the controller) and the termination notice directory are the VM's own, so a
    notice file the backend writes on the VM is seen in the container (docker creates the directory
    when it is missing). The VM's network (`--network host`): the bucket endpoint the run is given may be
    the VM's loopback (the qemu backend's forwarder on 127.0.0.1), which a container of its own network
    namespace would not reach. `--gpus all` only where the VM has GPUs (`docker_gpus`). A run's workdir
    (`code_dir` on the VM) is mounted read-only at CONTAINER_WORKDIR, the container's working directory."""
    notice_dir = DEFAULT_NOTICE_FILE.rpartition("/")[0]
    code = ["-v", f"{code_dir}:{CONTAINER_WORKDIR}:ro", "-w", CONTAINER_WORKDIR] if code_dir else []
    return ["docker", "run", "--rm", "--name", f"gpukit-{run}-{attempt}", *(["--gpus", "all"] if gpus else []),
            "--network", "host",
            "-v", "/mnt/s3:/mnt/s3", "-v", f"{remote.CREDENTIALS_PATH}:{remote.CREDENTIALS_PATH}:ro",
            "-v", f"{notice_dir}:{notice_dir}:ro", "--env-file", env_file,
            "--env", f"{NOTICE_FILE_ENV}={DEFAULT_NOTICE_FILE}", *code, image, *argv]

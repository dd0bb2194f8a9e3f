"""runtime: docker: `docker run` gets `--gpus all` only where the VM has GPUs, always the VM's network (the
bucket endpoint may be the VM's loopback forwarder), and the GPU probe decides from the VM itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from glue.infra.inventory import Host
from glue.runs import docker_run
from glue.runs.docker_run import GPU_PROBE, docker_argv, docker_gpus


def _opts(argv: list[str], image: str) -> list[str]:
    return argv[:argv.index(image)]


@pytest.mark.parametrize("gpus", [True, False])
def test_docker_argv_gpu_flags_follow_the_vm(gpus: bool) -> None:
    argv = docker_argv("r1", 2, "gpukit-trainer:offline", ["python", "-m", "glue.examples.tiny_gpt"],
                       "/run/gpukit-runs/r1/attempt-2.env", gpus=gpus)
    opts = _opts(argv, "gpukit-trainer:offline")
    assert argv[len(opts) + 1:] == ["python", "-m", "glue.examples.tiny_gpt"]
    assert ("--gpus" in opts) is gpus
    if gpus:
        assert opts[opts.index("--gpus") + 1] == "all"
    assert opts[opts.index("--network") + 1] == "host"
    assert opts[:3] == ["docker", "run", "--rm"] and "/mnt/s3:/mnt/s3" in opts


def test_docker_argv_defaults_to_gpus() -> None:
    assert "--gpus" in docker_argv("r", 1, "img", ["python"], "/e.env")


class _Res:
    def __init__(self, code: int) -> None:
        self.exit_code, self.stdout, self.stderr = code, "", ""


@pytest.mark.parametrize(("code", "expected"), [(0, True), (1, False)])
def test_docker_gpus_probes_the_vm(monkeypatch: pytest.MonkeyPatch, code: int, expected: bool) -> None:
    seen: list[str] = []

    def run(home: Path, host: Host, command: str, timeout: float = 0, **_: Any) -> _Res:
        seen.append(command)
        return _Res(code)

    monkeypatch.setattr(docker_run.ssh, "run", run)
    host = Host("gpukit-1", "id", "127.0.0.1", 2222, "root", "key", "none", 0, "qemu")
    assert docker_gpus(Path("/nowhere"), host) is expected
    assert seen == [GPU_PROBE] and "nvidia-smi -L" in GPU_PROBE and "/dev/nvidia0" in GPU_PROBE


def test_a_docker_run_gets_the_workdir_read_only_as_its_working_directory() -> None:
    from glue.train.workspace.paths import CONTAINER_WORKDIR

    argv = docker_argv("r1", 2, "img", ["python", "train.py"], "/e.env", gpus=False,
                       code_dir="/var/lib/gpukit/work/r1/attempt-2/code")
    opts = _opts(argv, "img")
    assert f"/var/lib/gpukit/work/r1/attempt-2/code:{CONTAINER_WORKDIR}:ro" in opts
    assert opts[opts.index("-w") + 1] == CONTAINER_WORKDIR == "/gpukit/workdir"
    assert argv[-2:] == ["python", "train.py"]
    assert "-w" not in _opts(docker_argv("r1", 2, "img", ["python"], "/e.env"), "img")  # no workdir: as before


def test_launch_puts_the_code_first_on_pythonpath_and_runs_the_runs_python() -> None:
    from glue.runs.workspace import launch

    ready = {"python": "/w/venv/bin/python", "code_dir": "/w/code", "package_sha256": "ab" * 32,
             "requirements_set": "cd" * 32}
    argv, env, cwd = launch(["/opt/gpukit/venv/bin/python", "train.py"], "/opt/gpukit/venv/bin/python",
                            {"PYTHONPATH": "/extra"}, ready, docker=False)
    assert argv == ["/w/venv/bin/python", "train.py"] and cwd == "/w/code"
    assert env["PYTHONPATH"] == "/w/code:/extra" and env["GPUKIT_WORKDIR"] == "/w/code"
    argv, env, _ = launch(["python", "train.py"], "/opt/gpukit/venv/bin/python", {}, ready, docker=True)
    assert argv == ["python", "train.py"] and env["PYTHONPATH"] == env["GPUKIT_WORKDIR"] == "/gpukit/workdir"
    assert launch(["x"], "/p", {"A": "1"}, None, docker=False) == (["x"], {"A": "1"}, None)

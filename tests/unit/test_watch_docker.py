"""runtime: docker: the trainer's container sees the VM's termination notice file (glue.train.run.notice)."""

from __future__ import annotations

from glue.runs.docker_run import docker_argv
from glue.runs.remote import CREDENTIALS_PATH
from glue.train.run.notice import DEFAULT_NOTICE_FILE, NOTICE_FILE_ENV


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_docker_argv_binds_the_notice_directory_and_names_the_file() -> None:
    argv = docker_argv("r1", 3, "reg.example/train:1", ["python", "train.py", "--x"], "/run/gpukit-runs/a-3.env")
    image_at = argv.index("reg.example/train:1")
    opts, command = argv[:image_at], argv[image_at + 1:]
    assert opts[:2] == ["docker", "run"] and command == ["python", "train.py", "--x"]
    notice_dir = DEFAULT_NOTICE_FILE.rpartition("/")[0]
    binds = _pairs(opts, "-v")
    # The directory, not the file: the file appears only when the backend announces a termination.
    assert f"{notice_dir}:{notice_dir}:ro" in binds
    assert "/mnt/s3:/mnt/s3" in binds and f"{CREDENTIALS_PATH}:{CREDENTIALS_PATH}:ro" in binds
    assert f"{NOTICE_FILE_ENV}={DEFAULT_NOTICE_FILE}" in _pairs(opts, "--env")
    assert _pairs(opts, "--env-file") == ["/run/gpukit-runs/a-3.env"] and _pairs(opts, "--name") == ["gpukit-r1-3"]
    assert not any("secret" in a.lower() for a in argv)  # secrets travel in the env file, never in argv

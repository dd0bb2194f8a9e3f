"""A warm trainer process (glue.train.run.warm) on this machine, no VM: real processes, real torch.

It takes an attempt handed over by `python -m glue.train.run.start` and becomes its supervisor, the trainer
forked with torch already loaded and the spec's argv, environment and cwd applied; the pids file, the log and
the exit record are a cold start's, kill -9 of the trainer included. An attempt of another environment goes
to that environment's warm process (a run's venv, reached through the run's link to it), or starts cold and
says why; either way the warm processes left waiting end. Modules the followed runs recorded are loaded
before the attempt arrives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glue.train.layout import ATTEMPTS_PREFIX, WARM_IMPORTS, run_prefix
from glue.train.run import warm_fit, warm_imports
from glue.train.run.launch import LaunchSpec, SpecBucket
from glue.train.run.start import SOCKET_ENV, socket_for
from glue.train.workspace import venv

ROOT = Path(__file__).resolve().parents[2]
TRAINER = """
import json, os, sys, time
said = {"torch_at_start": "torch" in sys.modules, "argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__,
        "var": os.environ.get("WARM_TEST_VAR"), "path0": sys.path[0], "wave": "wave" in sys.modules,
        "prefix": os.path.realpath(sys.prefix)}
if said["torch_at_start"]:
    import torch
    said["threads"] = torch.get_num_threads()
print(json.dumps(said), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(120)
sys.exit(int(sys.argv[2]))
"""


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.code, self.mount = tmp, tmp / "code", tmp / "mnt"
        self.code.mkdir()
        self.mount.mkdir()
        (self.code / "warm_test_trainer.py").write_text(TRAINER)
        self.sock = str(tmp / "warm" / "trainer.sock")
        self.state = tmp / "state" / "wr"
        self.state.mkdir(parents=True)

    def spec(self, python: str, *args: str) -> str:
        spec = LaunchSpec(run="wr", attempt=2, command=[python, "-m", "warm_test_trainer", *args],
                          env={"WARM_TEST_VAR": "from-spec", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"},
                          cwd=str(self.code),
                          bucket=SpecBucket(name="b", via="mount", mount=str(self.mount)))
        path = self.state / "attempt-2.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(spec.to_json())
        return str(path)

    def warm(self, python: str = sys.executable, sock: str | None = None, *options: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([python, "-m", "glue.train.run.warm", *options, sock or self.sock], cwd=ROOT,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        self.warm_said = []
        while True:  # "ready on" is printed once torch, the trainer library and the followed imports are loaded
            line = proc.stdout.readline()
            self.warm_said.append(line)
            assert line, self.warm_said
            if "ready on" in line:
                return proc

    def run_env(self) -> tuple[str, str]:
        """A run's own environment as a VM holds one: the set's venv (over this one's packages) and the run's
        link to it. Returns (the set's python, the run's python)."""
        env = self.tmp / "envs" / "0123456789abcdef"
        venv.create(env)
        link = self.tmp / "work" / "wr" / "venv-0123456789abcdef"
        link.parent.mkdir(parents=True)
        link.symlink_to(env, target_is_directory=True)
        return str(venv.python_of(env)), str(venv.python_of(link))

    def start(self, spec: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "glue.train.run.start", spec], cwd=ROOT, text=True,
                              capture_output=True, env={**os.environ, SOCKET_ENV: self.sock}, timeout=120)

    def pids(self) -> dict[str, Any]:
        path = self.state / "attempt-2.pids.json"
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return dict(json.loads(path.read_text()))

    def exit_record(self) -> dict[str, Any]:
        path = self.mount / run_prefix("wr") / f"{ATTEMPTS_PREFIX}2.exit.json"
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return dict(json.loads(path.read_text()))

    def said(self) -> dict[str, Any]:
        return dict(json.loads((self.state / "attempt-2.log").read_text().splitlines()[0]))


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def test_a_warm_process_takes_the_attempt_and_supervises_it_as_a_cold_start_would(setup: Setup) -> None:
    warm = setup.warm()
    try:
        assert stat.S_IMODE(os.stat(setup.sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(setup.sock)).st_mode) == 0o700
        res = setup.start(setup.spec(sys.executable, "ok", "3"))
        assert res.returncode == 0, res.stderr
        pids = setup.pids()
        assert pids["start"] == "warm" and pids["supervisor_pid"] == warm.pid != pids["trainer_pid"]
        assert not os.path.exists(setup.sock)  # taken: no second attempt reaches it
        record = setup.exit_record()
        assert record["exit_code"] == 3 and record["signal"] is None
        said = setup.said()
        assert said == {"torch_at_start": True, "threads": 2, "argv": ["ok", "3"], "cwd": str(setup.code),
                        "var": "from-spec", "name": "__main__", "path0": str(setup.code), "wave": False,
                        "prefix": os.path.realpath(sys.prefix)}
        assert warm.wait(timeout=30) == 3  # the supervisor's own exit, as a cold one's
    finally:
        warm.kill()


def test_kill_9_of_a_warm_trainer_is_recorded_as_the_signal(setup: Setup) -> None:
    warm = setup.warm()
    try:
        assert setup.start(setup.spec(sys.executable, "sleep", "0")).returncode == 0
        pids = setup.pids()
        deadline = time.monotonic() + 30
        while not (setup.state / "attempt-2.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pids["trainer_pid"], signal.SIGKILL)
        record = setup.exit_record()
        assert record["signal"] == signal.SIGKILL and record["exit_code"] is None
    finally:
        warm.kill()


def test_another_interpreter_starts_cold_and_says_why(setup: Setup) -> None:
    other = shutil.which("python3", path="/usr/bin") or "/usr/bin/python3"
    warm = setup.warm()
    try:
        res = setup.start(setup.spec(other, "ok", "0"))  # the cold supervisor runs in the foreground
        assert res.returncode == 0, res.stderr
        reason = f"no warm trainer process for the environment of {other} on this VM"
        assert f"gpukit: cold start: {reason}" in res.stderr and "Traceback" not in res.stderr
        pids = setup.pids()
        assert pids["start"] == "cold" and pids["cold_reason"].startswith(reason)
        assert pids["supervisor_pid"] != warm.pid
        assert setup.said()["torch_at_start"] is False
        assert setup.exit_record()["exit_code"] == 0
        # The VM runs an attempt now: the trainer venv's warm process, left waiting, was ended.
        assert warm.wait(timeout=30) == -signal.SIGTERM
    finally:
        warm.kill()


def test_a_run_environment_has_its_own_warm_process_and_the_trainer_venvs_ends(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    env_python, run_python = setup.run_env()
    monkeypatch.setenv(SOCKET_ENV, setup.sock)
    env_sock = socket_for(run_python)  # the run's link and the set's folder: one environment, one socket
    assert env_sock == socket_for(env_python) != setup.sock
    image = setup.warm()
    own = setup.warm(env_python, env_sock)
    try:
        res = setup.start(setup.spec(run_python, "ok", "0"))
        assert res.returncode == 0, res.stderr
        pids = setup.pids()
        assert pids["start"] == "warm" and pids["supervisor_pid"] == own.pid
        assert setup.exit_record()["exit_code"] == 0
        said = setup.said()
        assert said["torch_at_start"] is True and said["prefix"] == os.path.realpath(setup.tmp / "envs" /
                                                                                        "0123456789abcdef")
        assert own.wait(timeout=30) == 0
        assert image.wait(timeout=30) == -signal.SIGTERM  # no longer an idle spare: the other one ended
    finally:
        image.kill()
        own.kill()


def test_the_followed_runs_recorded_imports_are_loaded_before_the_attempt(setup: Setup, local_bucket: Any) -> None:
    s3 = local_bucket.client()
    record = {"modules": ["wave", "gpukit_no_such_module"], "recorded_at": "2026-12-07T00:00:00Z"}
    s3.put_object(Bucket=local_bucket.info.name, Key=f"{run_prefix('wr')}{WARM_IMPORTS}",
                  Body=json.dumps(record).encode())
    creds = setup.tmp / "creds.json"
    creds.write_text(json.dumps({"access_key": local_bucket.creds.access_key,
                                 "secret_key": local_bucket.creds.secret_key}))
    follow = setup.tmp / "follow.json"
    follow.write_text(json.dumps({"bucket": {"name": local_bucket.info.name, "endpoint": local_bucket.info.endpoint,
                                             "region": "us-east-1"},
                                  "credentials_file": str(creds), "runs": ["wr", "never-recorded"],
                                  "env": {"WARM_TEST_VAR": "from-spec"}, "secrets": ["A_SECRET"]}))
    warm = setup.warm(sys.executable, None, "--follow", str(follow))
    try:
        said = "".join(setup.warm_said)
        assert "run wr: loaded 1 recorded modules (1 could not be imported here, e.g. gpukit_no_such_module)" in said
        assert setup.start(setup.spec(sys.executable, "ok", "0")).returncode == 0
        assert setup.exit_record()["exit_code"] == 0
        assert setup.said()["wave"] is True
        assert warm.wait(timeout=30) == 0
    finally:
        warm.kill()


def test_the_recorded_imports_are_library_modules_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "users_own_module_xyz.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import wave  # noqa: F401 - a library module

    import users_own_module_xyz  # noqa: F401 - the run's own code, as a trainer imports it

    names = warm_imports.loaded()
    assert "json" in names and "wave" in names and "pytest" in names  # the standard library, site-packages
    assert "users_own_module_xyz" not in names and "__main__" not in names
    assert warm_imports.modules_of({"modules": ["a", 3, "", "__main__"]}) == ["a"]
    assert warm_imports.modules_of(["a"]) == []


def test_what_a_warm_process_cannot_run_is_named() -> None:
    def spec(command: list[str], env: dict[str, str] | None = None) -> LaunchSpec:
        return LaunchSpec(run="r", attempt=1, command=command, env=env or {}, bucket=SpecBucket(name="b"))

    stamp = warm_fit.packages_stamp()
    py = sys.executable
    assert warm_fit.refusal(spec([py, "-m", "glue.examples.tiny_gpt", "--x"]), stamp) == \
        warm_fit.Entry(module="glue.examples.tiny_gpt", script=None, args=["--x"])
    assert warm_fit.refusal(spec([py, "train.py"], {"PYTHONPATH": "/code", "PYTHONUNBUFFERED": "1",
                                                     "OMP_NUM_THREADS": "1"}), stamp) == \
        warm_fit.Entry(module=None, script="train.py", args=[])
    cases = {
        "the attempt sets PYTHONHASHSEED, which only a new interpreter reads":
            spec([py, "-m", "m"], {"PYTHONHASHSEED": "7"}),
        "the attempt sets LD_PRELOAD, which only a new interpreter reads": spec([py, "-m", "m"], {"LD_PRELOAD": "x"}),
        "the attempt's thread counts (OMP_NUM_THREADS=2, MKL_NUM_THREADS=4) are not one positive number":
            spec([py, "-m", "m"], {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "4"}),
        "a distributed group starts its workers under torchrun": spec([py, "-m", "glue.train.run.process_group"]),
        "the attempt's interpreter options '-X' need a new interpreter": spec([py, "-X", "dev", "t.py"]),
        "the attempt runs docker, not the warm process's interpreter": spec(["docker", "run", "img"]),
    }
    for reason, s in cases.items():
        got = warm_fit.refusal(s, stamp, env_now={})
        assert isinstance(got, str) and got.startswith(reason), (reason, got)
    assert warm_fit.refusal(spec([py, "-m", "m"]), "another stamp") == \
        "the trainer venv's packages changed after the warm process started"
    # Once a run's recorded modules are loaded, a variable a library may read on import must be as they were
    # loaded under; glue's own and the secrets (read at run time) may differ.
    hf = spec([py, "-m", "m"], {"HF_HUB_OFFLINE": "1", "GPUKIT_RUN": "r", "A_SECRET": "s", "PYTHONPATH": "/c"})
    assert warm_fit.refusal(hf, stamp, env_now={"HF_HUB_OFFLINE": "0"}, preloaded=frozenset({"A_SECRET"})) == \
        "the attempt sets HF_HUB_OFFLINE otherwise than the environment the warm process loaded the run's modules under"
    assert isinstance(warm_fit.refusal(hf, stamp, env_now={"HF_HUB_OFFLINE": "1"}, preloaded=frozenset({"A_SECRET"})),
                      warm_fit.Entry)
    assert isinstance(warm_fit.refusal(hf, stamp, env_now={}, preloaded=None), warm_fit.Entry)  # nothing preloaded

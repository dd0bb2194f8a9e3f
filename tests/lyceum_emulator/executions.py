"""The emulator's serverless runs (Lyceum's documented execution API), as processes on this machine.

  POST /execution/image/start   {docker_image_ref, docker_run_cmd, docker_run_env?, execution_type?,
                                 timeout? (1-600), enable_s3_mount? (default true), ...}
                                -> {execution_id, status: "pending", streaming_url}
  GET  /execution/{id}          {execution_id, status, stdout, stderr, exit_code, execution_type, ...}
  GET  /logs/execution/{id}     {logs: [{timestamp, message, level, execution_id}], total}; ?limit=&hours=
  POST /workloads/abort/{id}    hard stop: aborted

The "container" is a process running `docker_run_cmd` (the image is recorded, not pulled) with the
environment `docker_run_env` gives and, with enable_s3_mount, the bucket at /mnt/s3: a private mount
namespace (tmpfs over /mnt, the bucket's directory bound at /mnt/s3), as Lyceum mounts the account's
bucket into a run. pending -> starting -> running -> completed (exit 0) | failed (non-zero) |
aborted; `fail()` ends one as system_failure (an infrastructure loss); past `timeout` (scaled by
`seconds_per_timeout_unit`, the unit not being documented) the run is killed and ends `timeout_status`.
Request bodies are never kept: the environment carries secrets.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ENDED = ("completed", "failed", "system_failure", "cancelled", "aborted", "timeout")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Run:
    execution_id: str
    image: str
    command: list[str]
    env: dict[str, str]
    execution_type: str
    timeout: int
    mount: bool
    created_at: float
    status: str = "pending"
    exit_code: int | None = None
    logs: list[tuple[float, str, str]] = field(default_factory=list)  # (time, level, message)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    ended_as: str | None = None  # set by abort/fail/cap before the process is killed


class Executions:
    def __init__(self, home: Path, bucket_dir: Path, pending_s: float = 0.2) -> None:
        self.home = home
        self.bucket_dir = bucket_dir
        self.pending_s = pending_s
        self.seconds_per_timeout_unit = 1.0
        self.timeout_status = "failed"  # what a run killed at its cap ends as ("timeout": older API)
        self.runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    # -- routes --------------------------------------------------------------------------------
    def route(self, method: str, route: str, raw: bytes, query: str) -> tuple[int, Any, dict[str, str]] | None:
        if method == "POST" and route == "/execution/image/start":
            return self._start(raw)
        got = re.fullmatch(r"/execution/([^/]+)", route)
        if method == "GET" and got:
            run = self.runs.get(got.group(1))
            return (200, self._doc(run), {}) if run else (404, {"detail": "Execution not found"}, {})
        got = re.fullmatch(r"/logs/execution/([^/]+)", route)
        if method == "GET" and got:
            run = self.runs.get(got.group(1))
            if run is None:
                return 404, {"detail": "Execution not found"}, {}
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            limit = int(params.get("limit", "1000"))
            rows = [{"timestamp": _iso(t), "message": m, "level": lvl, "execution_id": run.execution_id,
                     "labels": {}} for t, lvl, m in list(run.logs)[-limit:]]
            return 200, {"logs": rows, "total": len(run.logs)}, {}
        got = re.fullmatch(r"/workloads/abort/([^/]+)", route)
        if method == "POST" and got:
            run = self.runs.get(got.group(1))
            if run is None:
                return 404, {"detail": "Execution not found"}, {}
            if run.status in ENDED:
                return 400, {"detail": f"Execution already {run.status}"}, {}
            self._end(run, "aborted")
            return 200, {"execution_id": run.execution_id, "status": "aborted"}, {}
        return None

    def _start(self, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return 422, {"detail": [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error"}]}, {}
        errors = _validate(body)
        if errors:
            return 422, {"detail": errors}, {}
        env = dict(line.split("=", 1) for line in str(body.get("docker_run_env") or "").splitlines() if "=" in line)
        run = Run(execution_id=str(uuid.uuid4()), image=body["docker_image_ref"], command=list(body["docker_run_cmd"]),
                  env=env, execution_type=str(body.get("execution_type") or "cpu"),
                  timeout=int(body.get("timeout") or 60), mount=bool(body.get("enable_s3_mount", True)),
                  created_at=time.time())
        with self._lock:
            self.runs[run.execution_id] = run
        threading.Thread(target=self._run, args=(run,), name=f"exec-{run.execution_id[:8]}", daemon=True).start()
        return 200, {"execution_id": run.execution_id, "status": "pending",
                     "streaming_url": f"wss://emulator.invalid/stream/{run.execution_id}"}, {}

    def _doc(self, run: Run) -> dict[str, Any]:
        out = [m for _, lvl, m in run.logs if lvl == "info"]
        err = [m for _, lvl, m in run.logs if lvl == "error"]
        return {"execution_id": run.execution_id, "status": run.status, "execution_type": run.execution_type,
                "docker_image_ref": run.image, "created_at": _iso(run.created_at), "exit_code": run.exit_code,
                "stdout": "\n".join(out[-200:]), "stderr": "\n".join(err[-200:]), "result": None}

    # -- test controls -------------------------------------------------------------------------
    def fail(self, execution_id: str, status: str = "system_failure") -> None:
        """End a run out of band: the machine under it lost (system_failure) or anything else ended."""
        self._end(self.runs[execution_id], status)

    def stop_all(self) -> None:
        for run in list(self.runs.values()):
            if run.status not in ENDED:
                self._end(run, "aborted")

    # -- running -------------------------------------------------------------------------------
    def _argv(self, run: Run) -> list[str]:
        if not run.mount:
            return run.command
        # Root in a private mount namespace: /mnt/s3 here is the bucket, and nothing of it leaks out.
        script = 'mount -t tmpfs none /mnt && mkdir /mnt/s3 && mount --bind "$0" /mnt/s3 && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.bucket_dir),
                *run.command]

    def _run(self, run: Run) -> None:
        time.sleep(self.pending_s)
        if run.status in ENDED:
            return
        run.status = "starting"
        work = self.home / "executions" / run.execution_id
        work.mkdir(parents=True, exist_ok=True)
        # The "image" is this machine with the kit's venv first on PATH: its python3 has gpukit's trainer library,
        # as the trainer image (images/trainer/Dockerfile) does.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        env = {"PATH": path, "HOME": str(work), "TMPDIR": str(work), **run.env}
        try:
            run.proc = subprocess.Popen(self._argv(run), cwd=work, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            run.logs.append((time.time(), "error", f"cannot start: {exc}"))
            run.status = "system_failure"
            return
        if run.ended_as is not None:  # aborted while it was starting
            os.killpg(run.proc.pid, signal.SIGKILL)
        else:
            run.status = "running"
        readers = [threading.Thread(target=self._read, args=(run, pipe, lvl), daemon=True)
                   for pipe, lvl in ((run.proc.stdout, "info"), (run.proc.stderr, "error"))]
        for t in readers:
            t.start()
        try:
            code = run.proc.wait(timeout=run.timeout * self.seconds_per_timeout_unit)
        except subprocess.TimeoutExpired:
            self._end(run, self.timeout_status)
            code = run.proc.wait()
        for t in readers:
            t.join(5)
        run.exit_code = code
        run.status = run.ended_as or ("completed" if code == 0 else "failed")

    @staticmethod
    def _read(run: Run, pipe: Any, level: str) -> None:
        for line in iter(pipe.readline, b""):
            run.logs.append((time.time(), level, line.decode(errors="replace").rstrip("\n")))

    def _end(self, run: Run, status: str) -> None:
        run.ended_as = status
        proc = run.proc
        if proc is None or proc.poll() is not None:
            run.status = status
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _validate(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ["body"], "msg": "Input should be a valid dictionary"}]
    errors: list[dict[str, Any]] = []
    if not isinstance(body.get("docker_image_ref"), str):
        errors.append({"type": "missing", "loc": ["body", "docker_image_ref"], "msg": "Field required"})
    cmd = body.get("docker_run_cmd")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
        errors.append({"type": "list_type", "loc": ["body", "docker_run_cmd"], "msg": "Input should be a valid list"})
    timeout = body.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 600:
        errors.append({"type": "less_than_equal", "loc": ["body", "timeout"],
                       "msg": "Input should be less than or equal to 600"})
    if not re.fullmatch(r"[a-zA-Z0-9_.]+", str(body.get("execution_type", "cpu"))):
        errors.append({"type": "string_pattern_mismatch", "loc": ["body", "execution_type"],
                       "msg": "String should match pattern '^[a-zA-Z0-9_.]+$'"})
    return errors

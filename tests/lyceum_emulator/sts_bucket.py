"""The emulator's bucket: `rclone serve s3` behind a small S3 front that enforces STS-style expiry.

rclone only knows static keys, so it is started with a pool of key pairs. Each
POST /storage/credentials hands out one pair with a fresh session token and an expiry. The front
(an HTTP proxy on loopback) checks every request's access key id and x-amz-security-token against
what was issued and forwards the request bytes untouched (rclone verifies the signature); after
the expiry it answers 400 ExpiredToken, like S3/MinIO do. A pair is handed out again only after
its last session expired, and the old token then stays rejected.
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from glue.paths import tool

HOST = "127.0.0.1"
_CRED_RE = re.compile(r"Credential=([^/,\s]+)/")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Session:
    access_key: str
    token: str
    expires_at: float


class StsBucket:
    """rclone (pool keys) + the expiry-enforcing front. `endpoint` is what clients use."""

    def __init__(self, root: Path, bucket: str = "gpukit", ttl: float = 900.0, pool_size: int = 128) -> None:
        self.root = root
        self.bucket = bucket
        self.ttl = ttl
        self.pool = {f"LYC{secrets.token_hex(8).upper()}": secrets.token_urlsafe(30) for _ in range(pool_size)}
        self._order = list(self.pool)
        self._next = 0
        self.current: dict[str, Session] = {}  # access key -> its latest session
        self.tokens: dict[str, Session] = {}  # every token ever issued
        self.rejections: list[str] = []  # S3 error codes the front answered (for tests)
        self._lock = threading.Lock()
        self._rclone: subprocess.Popen[bytes] | None = None
        self._front: ThreadingHTTPServer | None = None
        self.rclone_port = 0

    @property
    def endpoint(self) -> str:
        assert self._front is not None
        return f"http://{HOST}:{self._front.server_address[1]}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        data = self.root / "data"
        (data / self.bucket).mkdir(parents=True, exist_ok=True)
        self.rclone_port = _free_port()
        env = dict(os.environ)
        env["RCLONE_AUTH_KEY"] = ",".join(f'"{ak},{sk}"' for ak, sk in self.pool.items())
        env["RCLONE_CONFIG"] = "/dev/null"
        log = open(self.root / "rclone.log", "ab")
        self._rclone = subprocess.Popen(
            # A directory cache of 1 s (not rclone's 5 min): serverless runs write into `data` through their
            # /mnt/s3 (a bind mount, not through rclone), and S3 lists what they wrote within a second.
            # (0 s re-reads a directory on every request: a writer of many keys slows to a crawl.)
            [tool("rclone"), "serve", "s3", str(data), "--addr", f"{HOST}:{self.rclone_port}", "--log-level", "NOTICE",
             "--dir-cache-time", "1s"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._rclone.poll() is not None:
                raise RuntimeError(f"rclone exited at start; see {self.root / 'rclone.log'}")
            try:
                socket.create_connection((HOST, self.rclone_port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("rclone did not start")
        self._front = ThreadingHTTPServer((HOST, 0), _FrontHandler)
        self._front.daemon_threads = True
        self._front.sts = self  # type: ignore[attr-defined]
        threading.Thread(target=self._front.serve_forever, args=(0.05,), name="sts-front", daemon=True).start()

    def stop(self) -> None:
        if self._front is not None:
            self._front.shutdown()
            self._front.server_close()
            self._front = None
        if self._rclone is not None and self._rclone.poll() is None:
            self._rclone.terminate()
            try:
                self._rclone.wait(5)
            except subprocess.TimeoutExpired:
                self._rclone.kill()
                self._rclone.wait()
        self._rclone = None

    # -- credentials -------------------------------------------------------------------------
    def issue(self, ttl: float | None = None) -> dict[str, Any]:
        """One set of temporary credentials, in the shape POST /storage/credentials answers."""
        now = time.time()
        with self._lock:
            for _ in range(len(self._order)):
                ak = self._order[self._next % len(self._order)]
                self._next += 1
                held = self.current.get(ak)
                if held is None or held.expires_at <= now:
                    break
            else:
                raise RuntimeError("every pooled key is in use by an unexpired session")
            session = Session(ak, secrets.token_urlsafe(48), now + (ttl if ttl is not None else self.ttl))
            self.current[ak] = session
            self.tokens[session.token] = session
        return {
            "access_key": ak,
            "secret_key": self.pool[ak],
            "session_token": session.token,
            "endpoint": self.endpoint,
            "bucket_name": self.bucket,
            "region": "us-east-1",
            "expires_at": datetime.fromtimestamp(session.expires_at, UTC).isoformat(timespec="milliseconds"),
        }

    def expire_all(self) -> None:
        with self._lock:
            for session in self.tokens.values():
                session.expires_at = min(session.expires_at, time.time())

    def verdict(self, headers: Any, path: str) -> tuple[int, str, str] | None:
        """None to forward, else (status, S3 error code, message)."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        match = _CRED_RE.search(headers.get("Authorization", ""))
        ak = match.group(1) if match else (query.get("X-Amz-Credential", [""])[0].split("/")[0])
        token = headers.get("x-amz-security-token") or query.get("X-Amz-Security-Token", [""])[0]
        if not ak:
            return 403, "AccessDenied", "Anonymous access is not allowed."
        with self._lock:
            session = self.tokens.get(token) if token else None
            if ak not in self.pool or ak not in self.current:
                return 403, "InvalidAccessKeyId", "The Access Key Id you provided does not exist in our records."
            if session is None or session.access_key != ak:
                return 400, "InvalidToken", "The provided token is malformed or otherwise invalid."
            if session.expires_at <= time.time():
                return 400, "ExpiredToken", "The provided token has expired."
        return None


class _FrontHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lyceum-emulator-s3"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _proxy(self) -> None:
        sts: StsBucket = self.server.sts  # type: ignore[attr-defined]
        body = self._body()
        bad = sts.verdict(self.headers, self.path)
        if bad is not None:
            status, code, message = bad
            sts.rejections.append(code)
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                   f"<RequestId>{secrets.token_hex(8)}</RequestId></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)
            return
        # A serverless run writes its records in place through its /mnt/s3 (a bind of rclone's directory here):
        # a file that changes while rclone sends it comes short. S3 serves whole objects only (the old or the
        # new), so the read is made again.
        for tries_left in (2, 1, 0):
            conn = http.client.HTTPConnection(HOST, sts.rclone_port, timeout=120)
            try:
                resp, data = self._upstream(conn, body)
                break
            except http.client.IncompleteRead:
                if not tries_left:
                    raise
            finally:
                conn.close()
        self._answer(resp, data)

    def _upstream(self, conn: http.client.HTTPConnection,
                  body: bytes | None) -> tuple[http.client.HTTPResponse, bytes]:
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for key, value in self.headers.items():
            if key.lower() not in _HOP and key.lower() != "content-length":
                conn.putheader(key, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        elif self.command in ("PUT", "POST"):
            conn.putheader("Content-Length", "0")
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp, resp.read()

    def _answer(self, resp: http.client.HTTPResponse, data: bytes) -> None:
        self.send_response(resp.status, resp.reason)
        for key, value in resp.getheaders():
            if key.lower() not in _HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

"""A small client for Lyceum's public REST API (docs.lyceum.technology), stdlib only.

Endpoints (under the base URL, default https://api.lyceum.technology/api/v2/external):
POST /vms/create, GET /vms/{id}/status, GET /vms/list, GET /vms/availability, DELETE /vms/{id},
POST /storage/credentials. Auth: `Authorization: Bearer <key>` with the key from LYCEUM_API_KEY.

The key lives only in this object and in the request header: it is never part of a message, a
log line, an exception, a file or a process argument. 429 and 5xx answers (and connection errors)
are retried with exponential backoff (honouring Retry-After); 4xx answers become one-line
GlueErrors that carry the API's `detail`.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import random
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from glue.errors import GlueError

log = logging.getLogger("glue.cloud.lyceum")

DEFAULT_API_URL = "https://api.lyceum.technology/api/v2/external"
KEY_ENV = "LYCEUM_API_KEY"
URL_ENV = "LYCEUM_API_URL"
KEYS_PAGE = "https://dashboard.lyceum.technology/api-keys"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A VM in one of these states is gone for good: its disk is wiped and it is no longer billed.
GONE_STATUSES = frozenset({"terminated", "error", "failed", "stopped", "deleted"})
_JWT_RE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_KEY_RE = re.compile(r"^lk_[\x21-\x7e]{8,}$")


class LyceumError(GlueError):
    """An answer from the API that retrying does not fix (or retries ran out)."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class LyceumNotFound(LyceumError):
    """404: the VM (or route) does not exist."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and by total time."""

    attempts: int = 6
    base_s: float = 0.5
    max_s: float = 10.0
    deadline_s: float = 90.0


def api_key_from_env(env: dict[str, str] | None = None) -> str:
    """LYCEUM_API_KEY, checked for shape (never echoed back)."""
    raw = (env if env is not None else os.environ).get(KEY_ENV, "")
    key = raw.strip()
    if not key:
        raise GlueError(f"{KEY_ENV} is not set; create an API key at {KEYS_PAGE} and `export {KEY_ENV}=lk_...`")
    if not (_KEY_RE.match(key) or _JWT_RE.match(key)):
        raise GlueError(
            f"{KEY_ENV} is malformed (expected a Lyceum API key `lk_...` without spaces or quotes); "
            f"copy it again from {KEYS_PAGE}"
        )
    return key


def api_url_from_env(env: dict[str, str] | None = None) -> str:
    """LYCEUM_API_URL (default: Lyceum's production API). Plain http only to a loopback host."""
    url = (env if env is not None else os.environ).get(URL_ENV, "").strip() or DEFAULT_API_URL
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GlueError(f"{URL_ENV}={url!r} is not an http(s) URL")
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise GlueError(f"{URL_ENV} uses plain http to {parts.hostname}; the API key only travels over https "
                        "(plain http is allowed for 127.0.0.1 only)")
    return url.rstrip("/")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _detail_text(body: bytes) -> str:
    """The API's `detail` as one line: a string, or FastAPI's list of {loc, msg}."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace")
        return " ".join(text.split())[:300]
    detail = data.get("detail", data) if isinstance(data, dict) else data
    if isinstance(detail, list):
        items = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                items.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                items.append(str(item))
        detail = "; ".join(items)
    return " ".join(str(detail).split())[:300]


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class LyceumClient:
    """One API key against one base URL. Thread-safe: every request opens its own connection."""

    def __init__(self, api_key: str, base_url: str = DEFAULT_API_URL, retry: RetryPolicy | None = None,
                 timeout: float = 30.0) -> None:
        self._key = api_key
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.base_url)
        self._scheme = parts.scheme
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    @classmethod
    def from_env(cls, retry: RetryPolicy | None = None) -> LyceumClient:
        return cls(api_key_from_env(), api_url_from_env(), retry=retry)

    def __repr__(self) -> str:  # never show the key
        return f"LyceumClient({self.base_url!r})"

    # -- transport ---------------------------------------------------------------------------
    def _once(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, dict[str, str], bytes]:
        conn: http.client.HTTPConnection
        if self._scheme == "https":
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json",
                   "User-Agent": "gpukit-glue"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None,
                timeout: float | None = None, retry: bool = True) -> Any:
        """JSON in, JSON out. Retries 429/5xx/connection errors; raises LyceumError otherwise."""
        body = json.dumps(payload).encode() if payload is not None else None
        what = f"{method} {path}"
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            try:
                status, headers, data = self._once(method, path, body, timeout or self.timeout)
            except (OSError, http.client.HTTPException) as exc:
                reason = f"cannot reach the Lyceum API at {self.base_url} ({_os_reason(exc)})"
                status, headers, data = 0, {}, b""
            else:
                if status < 400:
                    return json.loads(data) if data.strip() else {}
                reason = f"Lyceum API {status} on {what}: {_detail_text(data) or http.client.responses.get(status, '')}"
                if status not in RETRY_STATUSES:
                    raise self._error(status, what, data)
                wait = _retry_after(headers.get("retry-after"))
            elapsed = time.monotonic() - start
            if not retry or attempt >= self.retry.attempts or elapsed >= self.retry.deadline_s:
                tries = f" (gave up after {attempt} attempts)" if attempt > 1 else ""
                raise LyceumError(f"{reason}{tries}", status or None, _detail_text(data) if status else "")
            backoff = min(self.retry.max_s, self.retry.base_s * 2 ** (attempt - 1))
            delay = min(wait if wait is not None else random.uniform(backoff / 2, backoff),
                        max(0.0, self.retry.deadline_s - elapsed), 30.0)
            log.warning("%s; retrying in %.1fs (attempt %d/%d)", reason, delay, attempt + 1, self.retry.attempts)
            time.sleep(delay)

    def _error(self, status: int, what: str, data: bytes) -> LyceumError:
        detail = _detail_text(data) or http.client.responses.get(status, "error")
        if status == 401:
            return LyceumError(f"Lyceum rejected the API key (401 on {what}: {detail}); check {KEY_ENV} "
                               f"(keys: {KEYS_PAGE})", status, detail)
        if status == 403:
            return LyceumError(f"Lyceum refused {what} (403: {detail}); is the API key active and allowed "
                               "to manage VMs?", status, detail)
        if status == 404:
            return LyceumNotFound(f"Lyceum: not found (404 on {what}: {detail})", status, detail)
        if status == 422:
            return LyceumError(f"Lyceum rejected the request as malformed (422 on {what}: {detail})", status, detail)
        return LyceumError(f"Lyceum API {status} on {what}: {detail}", status, detail)

    # -- endpoints ---------------------------------------------------------------------------
    def create_vm(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /vms/create, retried without ever creating two VMs.

        A create is not idempotent: after a 5xx or a lost connection the VM may exist anyway. So
        before retrying we look for a VM with our name that was not there before the first try,
        and adopt it instead of asking for another one. (A 429 was not processed: plain retry.)
        """
        name = str(body.get("name") or "")
        before = {str(v.get("vm_id")) for v in self.list_vms()} if name else set()
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return dict(self.request("POST", "/vms/create", body, timeout=150.0, retry=False))
            except LyceumError as exc:
                if exc.status is not None and exc.status not in RETRY_STATUSES:
                    raise
                elapsed = time.monotonic() - start
                if attempt >= self.retry.attempts or elapsed >= self.retry.deadline_s:
                    raise
                if exc.status != 429 and name:
                    for vm in self.list_vms():
                        if (str(vm.get("vm_id")) not in before and vm.get("name") == name
                                and str(vm.get("status", "")).lower() not in GONE_STATUSES):
                            log.warning("create of %s answered %s, but the VM exists (%s): adopting it",
                                        name, exc.status or "no answer", vm.get("vm_id"))
                            return vm
                delay = min(self.retry.max_s, self.retry.base_s * 2 ** (attempt - 1))
                log.warning("%s; retrying the create in %.1fs", exc, delay)
                time.sleep(random.uniform(delay / 2, delay))

    def vm_status(self, vm_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/vms/{urllib.parse.quote(vm_id, safe='')}/status"))

    def list_vms(self) -> list[dict[str, Any]]:
        data = self.request("GET", "/vms/list")
        vms = data.get("vms", []) if isinstance(data, dict) else data
        return [dict(v) for v in vms or []]

    def availability(self) -> list[dict[str, Any]]:
        data = self.request("GET", "/vms/availability")
        return [dict(v) for v in (data.get("available_instance_variants") or [])] if isinstance(data, dict) else []

    def delete_vm(self, vm_id: str) -> None:
        """Terminate a VM; one that is already gone (404) is not an error."""
        try:
            self.request("DELETE", f"/vms/{urllib.parse.quote(vm_id, safe='')}")
        except LyceumNotFound:
            pass

    def storage_credentials(self) -> dict[str, Any]:
        return dict(self.request("POST", "/storage/credentials"))


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__

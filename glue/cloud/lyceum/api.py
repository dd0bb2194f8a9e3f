"""A small client for Lyceum's public REST API (docs.lyceum.technology), on urllib3.

Endpoints (under the base URL, default https://api.lyceum.technology/api/v2/external):
POST /vms/create, GET /vms/{id}/status, GET /vms/list, GET /vms/availability, DELETE /vms/{id}, GET /pricing,
POST /storage/credentials. Auth: `Authorization: Bearer <key>` with the key from LYCEUM_API_KEY.

Transport: one urllib3 PoolManager per client (keep-alive connections, reused across requests
and threads) and a urllib3 Retry per request. Idempotent requests (GET, DELETE, and the harmless
POST /storage/credentials) are retried on 429/5xx, on a lost connection and on a connect failure,
with bounded exponential backoff and jitter; a Retry-After header is honoured, and one that points
past the request's retry deadline ends the retries at once. A POST /vms/create is never repeated
blindly: its retries (create_vm) first look for the VM it asked for, by name, and adopt it.

The key lives only in this object (redacted from its repr) and in the request header: it is never
part of a message, a log line, an exception, a file or a process argument, and an answer that
echoes it has it blanked out. 401/403/404/422 and other 4xx answers, answers that are not JSON and
retries that ran out become one-line LyceumErrors (GlueErrors) that carry the API's `detail`.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import re
import time
import urllib.parse
from typing import Any

import urllib3
from urllib3.exceptions import (
    HTTPError,
)

from glue.cloud.lyceum.answers import detail_text as _detail_text
from glue.cloud.lyceum.retry import RetryPolicy, _deadline_note, _Retry, _retry_after, _transport_reason, _Tries
from glue.errors import GlueError

log = logging.getLogger("glue.cloud.lyceum")

DEFAULT_API_URL = "https://api.lyceum.technology/api/v2/external"
KEY_ENV = "LYCEUM_API_KEY"
URL_ENV = "LYCEUM_API_URL"
KEYS_PAGE = "https://dashboard.lyceum.technology/api-keys"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Requests that may be sent twice without harm; everything else is sent once (create_vm adopts).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# A VM in one of these states is gone for good: its disk is wiped and it is no longer billed.
GONE_STATUSES = frozenset({"terminated", "error", "failed", "stopped", "deleted"})
CREATE_TIMEOUT_S = 150.0  # Lyceum answers a create once the VM is scheduled, which can take a while
POOL_SIZE = 10  # connections kept per host: terraform creates up to 10 VMs at once
_JWT_RE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_KEY_RE = re.compile(r"^lk_[\x21-\x7e]{8,}$")
_REDACTED = "<redacted>"


class LyceumError(GlueError):
    """An answer from the API that retrying does not fix (or retries ran out).

    status: the HTTP status (None: no answer). retryable: the request may be sent again (a 429, a
    5xx or a lost answer that the transport did not retry itself, a POST). retry_after: the
    answer's Retry-After, in seconds.
    """

    def __init__(self, message: str, status: int | None = None, detail: str = "", *,
                 retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.retryable = retryable
        self.retry_after = retry_after


class LyceumNotFound(LyceumError):
    """404: the VM (or route) does not exist."""


class LyceumCapacity(LyceumError):
    """A create refused for want of capacity. Live, Lyceum answers HTTP 500 "could not be provisioned" within
    seconds and creates nothing (not the 409 the docs describe): not retried, the caller says what else there is."""

    @staticmethod
    def is_one(exc: LyceumError) -> bool:
        text = f"{exc.detail} {exc}".lower()
        return exc.status == 409 or (exc.status == 500 and "could not be provisioned" in text)


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


class _Secret:
    """A string that does not show itself: repr/str say <redacted>."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__


class LyceumClient:
    """One API key against one base URL. Thread-safe: requests share one urllib3 PoolManager."""

    def __init__(self, api_key: str, base_url: str = DEFAULT_API_URL, retry: RetryPolicy | None = None,
                 timeout: float = 30.0) -> None:
        self._key = _Secret(api_key)
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.base_url)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._prefix = parts.path.rstrip("/")
        # block=False: more parallel requests than POOL_SIZE open extra connections, not waits.
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=POOL_SIZE, block=False)

    @classmethod
    def from_env(cls, retry: RetryPolicy | None = None) -> LyceumClient:
        return cls(api_key_from_env(), api_url_from_env(), retry=retry)

    def __repr__(self) -> str:  # never show the key
        return f"LyceumClient({self.base_url!r})"

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        self._pool.clear()

    def __enter__(self) -> LyceumClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scrub(self, text: str) -> str:
        key = self._key.reveal()
        return text.replace(key, _REDACTED) if key else text

    # -- transport ---------------------------------------------------------------------------
    def request(self, method: str, path: str, payload: dict[str, Any] | None = None,
                timeout: float | None = None, idempotent: bool | None = None,
                deadline: float | None = None, query: dict[str, str] | None = None) -> Any:
        """JSON in, JSON out. An idempotent request (default: by method) is retried on 429/5xx and
        lost connections; any request is retried when it could not connect (nothing was sent).
        Raises LyceumError (one line) for everything else."""
        method = method.upper()
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS
        what = f"{method} {path}"
        tries = _Tries()
        retries = _Retry(
            total=max(0, self.retry.attempts - 1), redirect=False, raise_on_status=False,
            status_forcelist=RETRY_STATUSES, respect_retry_after_header=True,
            allowed_methods=IDEMPOTENT_METHODS | ({method} if idempotent else set()),
            policy=self.retry, deadline=deadline if deadline is not None else time.monotonic() + self.retry.deadline_s,
            what=what, tries=tries, scrub=self._scrub,
        )
        headers = {"Authorization": f"Bearer {self._key.reveal()}", "Accept": "application/json",
                   "User-Agent": "gpukit-glue"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        per_try = timeout or self.timeout
        try:
            resp = self._pool.urlopen(
                method, self._origin + self._prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else ""),
                body=body, headers=headers, retries=retries,
                redirect=False, timeout=urllib3.Timeout(connect=min(per_try, 30.0), read=per_try),
            )
        except (HTTPError, OSError) as exc:
            # Not retried here: a lost answer to a POST (the caller decides), or retries ran out.
            raise LyceumError(self._scrub(f"cannot reach the Lyceum API at {self.base_url} "
                                          f"({_transport_reason(exc)}){tries.suffix()}"),
                              retryable=not tries.gave_up) from None
        return self._answer(what, resp.status, resp.headers, resp.data or b"", tries)

    def _answer(self, what: str, status: int, headers: Any, data: bytes, tries: _Tries) -> Any:
        if 200 <= status < 300:
            if not data.strip():
                return {}
            key = self._key.reveal().encode()
            try:  # a success that echoes the key: what is printed or kept of it never holds it
                return json.loads(data.replace(key, _REDACTED.encode()) if key else data)
            except ValueError:
                ctype = str(headers.get("Content-Type") or "no content type").split(";")[0]
                raise LyceumError(self._scrub(
                    f"Lyceum API answered {what} with {status} but a body that is not JSON ({ctype}: "
                    f"{_detail_text(data) or 'empty'!r}); is {URL_ENV} the API's URL?"), status) from None
        err = self._error(status, what, data, tries.suffix())
        err.retryable = status in RETRY_STATUSES and not tries.gave_up
        err.retry_after = _retry_after(headers.get("Retry-After"))
        raise err

    def _error(self, status: int, what: str, data: bytes, suffix: str = "") -> LyceumError:
        detail = self._scrub(_detail_text(data) or http.client.responses.get(status, "error"))
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
        if 300 <= status < 400:
            return LyceumError(f"Lyceum API answered {what} with a redirect ({status}) that gpukit does not "
                               f"follow; is {URL_ENV} the API's URL?", status, detail)
        return LyceumError(f"Lyceum API {status} on {what}: {detail}{suffix}", status, detail)

    def _object(self, what: str, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise LyceumError(f"Lyceum API answered {what} with JSON of an unexpected shape "
                              f"({type(data).__name__}, expected an object)")
        return data

    # -- endpoints ---------------------------------------------------------------------------
    def create_vm(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /vms/create, retried without ever creating two VMs.

        A create is not idempotent: after a 5xx or a lost answer the VM may exist anyway. So
        before retrying we look for a VM with our name that was not there before the first try,
        and adopt it instead of asking for another one. A 429 was not processed, and a create that
        could not connect was never sent: those are retried as they are. A create without a name
        cannot be recognised, so it is retried only after a 429.
        """
        what = "POST /vms/create"
        name = str(body.get("name") or "")
        before = {str(v.get("vm_id")) for v in self.list_vms()} if name else set()
        deadline = time.monotonic() + self.retry.deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._object(what, self.request("POST", "/vms/create", body, timeout=CREATE_TIMEOUT_S,
                                                       idempotent=False, deadline=deadline))
            except LyceumError as exc:
                if LyceumCapacity.is_one(exc):
                    raise LyceumCapacity(f"HTTP {exc.status}: {exc.detail or exc}", exc.status, exc.detail) from None
                if not exc.retryable:
                    raise
                if exc.status != 429 and not name:
                    raise LyceumError(f"{exc} (not retried: the create names no VM, so one it made anyway could "
                                      "not be recognised; check with `python -m glue.cloud.lyceum list`)",
                                      exc.status, exc.detail) from None
                left = deadline - time.monotonic()
                wait = exc.retry_after if exc.retry_after is not None else self.retry.backoff(attempt)
                if attempt >= self.retry.attempts or left <= 0 or wait > left:
                    tries = _Tries(sent=attempt, why="" if attempt >= self.retry.attempts else
                                   _deadline_note(exc.retry_after, self.retry.deadline_s))
                    raise LyceumError(f"{exc}{tries.suffix()}", exc.status, exc.detail) from None
                if exc.status != 429:
                    adopted = self._find_created(name, before, exc)
                    if adopted is not None:
                        return adopted
                log.warning("%s; retrying the create of %s in %.3gs (attempt %d/%d)", exc, name or "a VM",
                            wait, attempt + 1, self.retry.attempts)
                time.sleep(wait)

    def _find_created(self, name: str, before: set[str], exc: LyceumError) -> dict[str, Any] | None:
        """The VM named `name` that a create whose answer was lost made after all, if any."""
        try:
            vms = self.list_vms()
        except LyceumError as lookup:
            raise LyceumError(f"{exc}; the create of {name} may have gone through, and listing the VMs to "
                              f"check failed too ({lookup})", exc.status, exc.detail) from None
        for vm in vms:
            if (str(vm.get("vm_id")) not in before and vm.get("name") == name
                    and str(vm.get("status", "")).lower() not in GONE_STATUSES):
                log.warning("the create of %s answered %s, but the VM exists (%s): adopting it",
                            name, exc.status or "nothing", vm.get("vm_id"))
                return vm
        return None

    def vm_status(self, vm_id: str) -> dict[str, Any]:
        path = f"/vms/{urllib.parse.quote(vm_id, safe='')}/status"
        return self._object(f"GET {path}", self.request("GET", path))

    def list_vms(self) -> list[dict[str, Any]]:
        """The account's VMs; terminated ones left out (the live list includes them unless asked not to)."""
        data = self.request("GET", "/vms/list", query={"include_terminated": "false"})
        vms = data.get("vms", []) if isinstance(data, dict) else data
        if not isinstance(vms, list | None) or not all(isinstance(v, dict) for v in vms or []):
            raise LyceumError("Lyceum API answered GET /vms/list with JSON of an unexpected shape "
                              "(expected {\"vms\": [objects]})")
        return [dict(v) for v in vms or []]

    def availability_answer(self) -> dict[str, Any]:
        """GET /vms/availability as answered (glue.cloud.lyceum.capacity reads either shape)."""
        return self._object("GET /vms/availability", self.request("GET", "/vms/availability"))

    def availability(self) -> list[dict[str, Any]]:
        """The answer's entries: `available_hardware_profiles` (the guide's shape), then
        `available_instance_variants` (the API reference's)."""
        data = self.availability_answer()
        entries = [*(data.get("available_hardware_profiles") or []), *(data.get("available_instance_variants") or [])]
        return [dict(v) for v in entries if isinstance(v, dict)]

    def pricing(self) -> list[Any]:
        """GET /pricing: the account's price rows (a list, or an object holding one; glue.cloud.lyceum.pricing
        reads them)."""
        data = self.request("GET", "/pricing")
        rows = data if isinstance(data, list) else next(
            (v for v in data.values() if isinstance(v, list)), None) if isinstance(data, dict) else None
        if rows is None:
            raise LyceumError("Lyceum API answered GET /pricing with JSON of an unexpected shape (expected a list "
                              "of price rows)")
        return rows

    def delete_vm(self, vm_id: str) -> None:
        """Terminate a VM; one that is already gone (404) is not an error."""
        try:
            self.request("DELETE", f"/vms/{urllib.parse.quote(vm_id, safe='')}")
        except LyceumNotFound:
            pass

    def storage_credentials(self) -> dict[str, Any]:
        # A POST, but safe to repeat: each call only issues another set of expiring credentials.
        return self._object("POST /storage/credentials",
                            self.request("POST", "/storage/credentials", idempotent=True))

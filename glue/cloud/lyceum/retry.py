"""The Lyceum client's retry policy on urllib3's Retry: exponential backoff with jitter, a deadline for the
whole request, Retry-After honoured but bounded by that deadline, one log line per retry."""

from __future__ import annotations

import http.client
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from urllib3.exceptions import (
    InvalidHeader,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ResponseError,
    SSLError,
)
from urllib3.util.retry import Retry

from glue.cloud.lyceum.answers import detail_text, one_line

log = logging.getLogger("glue.cloud.lyceum")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and by total time.

    The wait before retry n (n = 1, 2, ...) is drawn from [b/2, b], b = min(max_s, base_s * 2**(n-1)),
    unless the answer says Retry-After. No request retries past deadline_s after it started.
    """

    attempts: int = 6
    base_s: float = 0.5
    max_s: float = 10.0
    deadline_s: float = 90.0

    def backoff(self, retry_number: int) -> float:
        ceiling = min(self.max_s, self.base_s * 2 ** max(0, retry_number - 1))
        return random.uniform(ceiling / 2, ceiling)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: delay-seconds (decimals tolerated) or an HTTP date; None if absent or junk."""
    if not value or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return Retry(total=0).parse_retry_after(value)
    except InvalidHeader:
        return None


def _transport_reason(exc: BaseException) -> str:
    """Why no answer came, in a few words (no object reprs, no URLs, no headers)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MaxRetryError) and cur.reason is not None:
            cur = cur.reason
            continue
        if isinstance(cur, NameResolutionError):
            return "host name not found"
        if isinstance(cur, SSLError):
            return f"TLS error: {one_line(str(cur.args[-1] if cur.args else cur), 160)}"
        if isinstance(cur, TimeoutError) or "timed out" in str(cur).lower():
            return "timed out"
        if isinstance(cur, http.client.RemoteDisconnected):
            return "the connection closed without an answer"
        if isinstance(cur, OSError) and cur.strerror:
            return str(cur.strerror)
        if isinstance(cur, ProtocolError) and len(cur.args) > 1 and isinstance(cur.args[1], BaseException):
            cur = cur.args[1]
            continue
        nxt = cur.__cause__ or cur.__context__
        if nxt is None:
            break
        cur = nxt
    if isinstance(exc, NewConnectionError):
        return "connection failed"
    return type(cur or exc).__name__


@dataclass
class _Tries:
    """Shared by every copy of one request's _Retry: what the caller reports when it gives up."""

    sent: int = 1  # requests sent so far
    gave_up: bool = False  # retries ran out (attempts or deadline) on a retryable failure
    why: str = ""  # why they ended early (the deadline), if they did

    def suffix(self) -> str:
        """What the final error adds: how many attempts, and why no more."""
        if self.why:
            return f" (gave up after {self.sent} attempt{'s' if self.sent > 1 else ''}: {self.why})"
        return f" (gave up after {self.sent} attempts)" if self.sent > 1 else ""


def _deadline_note(retry_after: float | None, deadline_s: float) -> str:
    if retry_after is not None:
        return f"Lyceum asked to retry after {retry_after:g}s, past the {deadline_s:g}s retry deadline"
    return f"the {deadline_s:g}s retry deadline passed"


class _Retry(Retry):
    """urllib3's Retry with RetryPolicy's backoff, a deadline for the whole request, Retry-After
    bounded by that deadline, and one log line per retry (what failed, how long we wait)."""

    def __init__(self, *args: Any, policy: RetryPolicy | None = None, deadline: float = 0.0, what: str = "",
                 tries: _Tries | None = None, scrub: Callable[[str], str] = str, wait: float = 0.0,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.policy = policy or RetryPolicy()
        self.deadline = deadline
        self.what = what
        self.tries = tries if tries is not None else _Tries()
        self.scrub = scrub  # blanks the key out of what the log line quotes from an answer
        self.wait = wait

    def new(self, **kw: Any) -> _Retry:
        for name in ("policy", "deadline", "what", "tries", "scrub"):
            kw.setdefault(name, getattr(self, name))
        return super().new(**kw)

    def get_retry_after(self, response: Any) -> float | None:
        return _retry_after(response.headers.get("Retry-After"))

    def increment(self, method: str | None = None, url: str | None = None, response: Any = None,
                  error: Exception | None = None, _pool: Any = None, _stacktrace: Any = None) -> _Retry:
        try:
            new = super().increment(method, url, response, error, _pool, _stacktrace)
        except MaxRetryError:
            self.tries.gave_up = True
            raise
        retry_after = self.get_retry_after(response) if response is not None else None
        wait = retry_after if retry_after is not None else self.policy.backoff(self.tries.sent)
        left = self.deadline - time.monotonic()
        if left <= 0 or (retry_after is not None and retry_after > left):
            self.tries.gave_up = True
            self.tries.why = _deadline_note(retry_after, self.policy.deadline_s)
            raise MaxRetryError(_pool, url or "", error or ResponseError(f"deadline ({self.policy.deadline_s:g}s)"))
        new.wait = min(wait, left)
        if response is not None:
            reason = f"Lyceum API {response.status}: {detail_text(response.data or b'')}"
        else:
            reason = _transport_reason(error) if error is not None else "no answer"
        self.tries.sent += 1
        log.warning("%s: %s; retrying in %.3gs (attempt %d/%d)", self.what, self.scrub(reason), new.wait,
                    self.tries.sent, self.policy.attempts)
        return new

    def sleep(self, response: Any = None) -> None:
        if self.wait > 0:
            time.sleep(self.wait)

"""Lyceum's expiring (STS-style) bucket credentials, kept fresh in <home>/bucket/credentials.json.

That 0600 file is the one Ansible's bucket_mount role and the trainer read. It holds
{access_key, secret_key, session_token, expires_at (epoch s), expires (UTC ISO-8601), issued_at,
endpoint, bucket, region, source: "lyceum"}; it is replaced atomically, so a reader never sees a
half-written file. Credentials are refreshed when less than a margin of their life is left
(a quarter of their lifetime, at most five minutes).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.errors import GlueError
from glue.paths import write_secret
from glue.train.storage.region import DEFAULT_REGION

SOURCE = "lyceum"
MAX_MARGIN_S = 300.0
# When the API gives no expiry, assume this lifetime (short: refreshing early is cheap).
ASSUMED_TTL_S = 900.0
_thread_lock = threading.Lock()


@dataclass(frozen=True)
class StoredCredentials:
    access_key: str
    secret_key: str = field(repr=False)  # never printed: reprs reach logs and tracebacks
    session_token: str | None = field(repr=False)
    expires_at: float
    issued_at: float
    endpoint: str
    bucket: str
    region: str

    def margin(self) -> float:
        return min(MAX_MARGIN_S, max(0.0, (self.expires_at - self.issued_at) / 4))

    def fresh(self, now: float | None = None) -> bool:
        return self.expires_at - (now if now is not None else time.time()) > self.margin()

    def bucket_info(self) -> BucketInfo:
        return BucketInfo(endpoint=self.endpoint, name=self.bucket, region=self.region)

    def bucket_credentials(self) -> BucketCredentials:
        return BucketCredentials(access_key=self.access_key, secret_key=self.secret_key,
                                 session_token=self.session_token, expires_at=self.expires_at)


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    return None


def parse(data: dict[str, Any], now: float | None = None) -> StoredCredentials:
    """A POST /storage/credentials answer -> StoredCredentials (tolerant of field-name variants)."""
    now = now if now is not None else time.time()
    try:
        access_key, secret_key = str(data["access_key"]), str(data["secret_key"])
        endpoint = str(data["endpoint"])
    except KeyError as exc:
        raise GlueError(f"Lyceum's storage credentials answer lacks {exc.args[0]!r}") from None
    bucket = data.get("bucket_name") or data.get("bucket")
    if not bucket:
        raise GlueError("Lyceum's storage credentials answer names no bucket (bucket_name)")
    if not endpoint.startswith(("http://", "https://")):
        endpoint = f"https://{endpoint}"
    expires = None
    for key in ("expires_at", "expiration", "expiry"):
        expires = _epoch(data.get(key))
        if expires is not None:
            break
    if expires is None and isinstance(data.get("expires_in"), int | float):
        expires = now + float(data["expires_in"])
    return StoredCredentials(
        access_key=access_key, secret_key=secret_key, session_token=data.get("session_token") or None,
        expires_at=expires if expires is not None else now + ASSUMED_TTL_S, issued_at=now,
        endpoint=endpoint.rstrip("/"), bucket=str(bucket), region=str(data.get("region") or DEFAULT_REGION),
    )


def read(path: Path) -> StoredCredentials | None:
    """The stored credentials, or None when the file is missing, unreadable or not Lyceum's."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("source") != SOURCE:
        return None
    try:
        return StoredCredentials(**{k: raw[k] for k in StoredCredentials.__dataclass_fields__})
    except (KeyError, TypeError):
        return None


def write(path: Path, creds: StoredCredentials) -> None:
    """Replace the file atomically; the new file is 0600 before any byte lands in it."""
    doc = {**asdict(creds), "source": SOURCE,
           "expires": datetime.fromtimestamp(creds.expires_at, UTC).isoformat(timespec="seconds")}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    write_secret(tmp, json.dumps(doc, indent=2))
    os.replace(tmp, path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One refresh at a time, across threads (the provider) and processes (provider vs glue)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(path.with_name(f".{path.name}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def current(path: Path, fetch: Callable[[], dict[str, Any]], force: bool = False) -> StoredCredentials:
    """Fresh credentials: the file's when they have enough life left, else new ones from `fetch`."""
    with _locked(path):
        stored = None if force else read(path)
        if stored is not None and stored.fresh():
            return stored
        new = parse(fetch())
        write(path, new)
        return new


class RefreshingCredentials:
    """A credentials callback for the checkpointer (glue.train.storage.s3_client's CredentialsCallback).

    It re-reads the credentials file whenever the copy it holds is near expiry, so whoever
    refreshes the file (the controller, or `refresh` given here) keeps long runs writing.
    """

    def __init__(self, path: Path, refresh: Callable[[], object] | None = None) -> None:
        self.path = path
        self._refresh = refresh
        self._held: StoredCredentials | None = None

    def __call__(self) -> BucketCredentials:
        held = self._held
        if held is None or not held.fresh():
            if self._refresh is not None:
                self._refresh()
            held = read(self.path)
            if held is None:
                raise GlueError(f"no Lyceum bucket credentials in {self.path}; run `glue up` or `glue status`")
            self._held = held
        return held.bucket_credentials()

"""The bucket credentials file on the VM (0600, refreshed in place by the controller). Light: no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from glue.train.storage.s3_client import CredentialsLike

# Where every VM keeps it (0600, on its tmpfs); the controller writes it, the trainer re-reads it.
TRAINER_FILE = "/run/gpukit/bucket-credentials.json"




@dataclass(frozen=True)
class FileCredentials:
    access_key: str
    secret_key: str = field(repr=False)  # never printed: reprs reach logs and tracebacks
    session_token: str | None = field(repr=False)
    expires_at: float | None


def credentials_from_file(path: str) -> FileCredentials:
    """Read the 0600 credentials file each call, so credentials refreshed into it are picked up."""
    raw = json.loads(Path(path).read_text())
    return FileCredentials(raw["access_key"], raw["secret_key"], raw.get("session_token"), raw.get("expires_at"))


def credentials_doc(creds: CredentialsLike) -> bytes:
    """The file's bytes for `creds` (the controller's BucketCredentials): the one writer of its format."""
    return json.dumps({"access_key": creds.access_key, "secret_key": creds.secret_key,
                       "session_token": creds.session_token, "expires_at": creds.expires_at}).encode()

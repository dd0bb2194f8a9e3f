"""Value types shared by the storage and cloud layers: where the bucket is and how to sign in to it."""

from __future__ import annotations

from dataclasses import dataclass, field

from glue.train.storage.region import DEFAULT_REGION


@dataclass(frozen=True)
class BucketInfo:
    """Where the persistent bucket is. Never holds credentials."""

    endpoint: str
    name: str
    region: str

    @property
    def signing_region(self) -> str:
        """The region requests are signed for: the bucket's own, else the default (rclone and MinIO accept any
        SigV4 region; AWS needs the real one)."""
        return self.region if self.region not in ("", "local") else DEFAULT_REGION


@dataclass(frozen=True)
class BucketCredentials:
    """S3 credentials; expiring (STS-style) ones carry a session token and an expiry (epoch s)."""

    access_key: str
    secret_key: str = field(repr=False)  # never printed: reprs end up in logs and tracebacks
    session_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None

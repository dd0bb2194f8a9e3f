"""`glue doctor`'s lines (what was checked, whether it holds, the fix when it does not), and what a
backend's own checks found."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Readiness:
    """A backend's doctor lines, and the bucket + credentials to probe with (None: nothing to probe
    without starting something, e.g. the local bucket server)."""

    checks: list[Check]
    bucket: BucketInfo | None = None
    credentials: BucketCredentials | None = None

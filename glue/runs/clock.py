"""The records' timestamps: ISO-8601 UTC with microseconds, as every record in the bucket spells them."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_iso(ts: datetime | None = None) -> str:
    return (ts or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)

"""UTC timestamps as every record glue.train writes spells them (ISO-8601, microseconds, `Z`)."""

from __future__ import annotations

from datetime import datetime, timezone

# datetime.UTC is Python 3.11+: the VM side runs on 3.10 too (make lint: tests/lint_vm_python.py).
UTC = timezone.utc


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    return ts.isoformat(timespec="microseconds").replace("+00:00", "Z")

"""Run verify.yml and keep its per-host summaries: `verify()` returns them and records the last run
in <home>/ansible/verify.json, which `last_verify()` reads back (what `glue status` shows)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.infra.ansible_run import run_playbook

VERIFY = "verify.yml"


def summary_file(home: Path) -> Path:
    return home / "ansible" / "verify.json"


def verify(home: Path, limit: list[str] | None = None, progress: bool = True) -> dict[str, dict[str, Any]]:
    """Run verify.yml; return {host: summary} and keep it in <home>/ansible/verify.json.

    A summary: {"ready": bool, "mount": {"mounted", "round_trip", "seconds" | "error"},
    "gpu": {"present", "status" (ready|no_gpu|...), "count", "names", "driver_version",
    "cuda_version"}, "runtime": {"mode", "ok", "python", "torch", ... | "error"}, "os", "backend"}.
    A host that could not be checked gets {"ready": False, "error": "..."}.
    """
    result = run_playbook(VERIFY, home, limit=limit, progress=progress)
    out: dict[str, dict[str, Any]] = {}
    for host in sorted(set(result.changed) | set(result.summaries) | set(result.failed)):
        if host == "*":
            continue
        summary = dict(result.summaries.get(host) or {"ready": False})
        summary["ready"] = bool(summary.get("ready")) and host not in result.failed
        if host in result.failed:
            summary["error"] = result.failed[host]
        out[host] = summary
    if "*" in result.failed and not out:
        raise GlueError(f"verify.yml did not run: {result.failed['*']}")
    record = {"checked_at": datetime.now(UTC).isoformat(timespec="seconds"), "seconds": result.seconds,
              "hosts": out}
    path = summary_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    return out


def last_verify(home: Path) -> dict[str, Any] | None:
    """The last verify() record ({"checked_at", "seconds", "hosts": {host: summary}}), if any."""
    try:
        data = json.loads(summary_file(home).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

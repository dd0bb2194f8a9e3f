"""Run verify.yml and keep its per-host summaries: `verify()` returns them and records the last run
in <home>/ansible/verify.json, which `last_verify()` reads back (what `glue status` shows)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.infra.ansible_run import PlaybookResult, converge, run_playbook

VERIFY = "verify.yml"
UP = "up.yml"


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
    out = _summaries(result, set(result.changed) | set(result.summaries) | set(result.failed))
    if "*" in result.failed and not out:
        raise GlueError(f"verify.yml did not run: {result.failed['*']}")
    _record(home, result.seconds, out, keep_others=limit is not None)
    return out


def converge_and_verify(home: Path, limit: list[str] | None = None,
                        progress: bool = True) -> tuple[PlaybookResult, dict[str, dict[str, Any]]]:
    """`glue up`'s configure step: up.yml (site.yml, then verify.yml) in one ansible-playbook run, one
    start and one connection per VM instead of two. Returns the run and the summaries of the hosts
    that reached verify.yml (recorded as `verify()` does; with `limit`, beside the other VMs' last
    ones); a host that failed site.yml has none."""
    result = converge(home, limit=limit, progress=progress, playbook=UP)
    out = _summaries(result, set(result.summaries))
    if out:
        _record(home, result.seconds, out, keep_others=limit is not None)
    return result, out


def _summaries(result: PlaybookResult, hosts: set[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for host in sorted(hosts - {"*"}):
        summary = dict(result.summaries.get(host) or {"ready": False})
        summary["ready"] = bool(summary.get("ready")) and host not in result.failed
        if host in result.failed:
            summary["error"] = result.failed[host]
        out[host] = summary
    return out


def _record(home: Path, seconds: float, hosts: dict[str, dict[str, Any]], keep_others: bool = False) -> None:
    """Keep the summaries; `keep_others`: a run on some VMs, the others' last summaries stay (each says
    which VM id it checked, so a replaced VM's is never taken for its successor's)."""
    earlier = (last_verify(home) or {}).get("hosts") if keep_others else None
    merged = {**(earlier if isinstance(earlier, dict) else {}), **hosts}
    record = {"checked_at": datetime.now(UTC).isoformat(timespec="seconds"), "seconds": seconds, "hosts": merged}
    path = summary_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))


def last_verify(home: Path) -> dict[str, Any] | None:
    """The last verify() record ({"checked_at", "seconds", "hosts": {host: summary}}), if any."""
    try:
        data = json.loads(summary_file(home).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

"""Notifications from `glue watch`: the run config's `notify:` block.

Each event is one JSON object: to `notify.command` on its stdin (never in its arguments), and as an
HTTP POST to `notify.webhook` (or the URL in the watcher's environment variable `notify.webhook_env`,
for URLs that carry a token). urllib3 retries the POST on connection errors and 5xx. The URL is never
logged or recorded: a failure names only its scheme and host.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any
from urllib.parse import urlparse

import urllib3
from urllib3.util.retry import Retry

from glue.runs.config import NotifySpec

COMMAND_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 10.0  # per try (connect, then read)
# Connection errors and 5xx are retried, backing off 0.5 s doubling (the first retry at once). Module
# level so a test can make it quick.
WEBHOOK_RETRY = Retry(total=4, connect=4, read=2, backoff_factor=0.5, status_forcelist=(500, 502, 503, 504),
               allowed_methods=frozenset({"POST"}), raise_on_status=False)


def _where(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.hostname or '?'}" + (f":{parsed.port}" if parsed.port else "")


def webhook_url(spec: NotifySpec) -> str | None:
    if spec.webhook:
        return spec.webhook
    return os.environ.get(spec.webhook_env) or None if spec.webhook_env else None


def send(spec: NotifySpec, event: dict[str, Any]) -> dict[str, str]:
    """Deliver `event` to the configured hooks when its kind is subscribed. Returns hook -> "ok" or the
    problem (a hook that fails never stops the watcher)."""
    if event.get("event") not in spec.events:
        return {}
    body = json.dumps(event, sort_keys=True).encode()
    results: dict[str, str] = {}
    if spec.command:
        try:
            proc = subprocess.run(list(spec.command), input=body, capture_output=True, timeout=COMMAND_TIMEOUT_S,
                                  check=False)
            results["command"] = "ok" if proc.returncode == 0 else \
                f"exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-200:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            results["command"] = f"{spec.command[0]}: {exc}"
    url = webhook_url(spec)
    if url:
        try:
            with urllib3.PoolManager(retries=WEBHOOK_RETRY, timeout=WEBHOOK_TIMEOUT_S) as pool:
                resp = pool.request("POST", url, body=body, headers={"Content-Type": "application/json"})
            results["webhook"] = "ok" if 200 <= resp.status < 300 else f"{_where(url)} answered {resp.status}"
        except urllib3.exceptions.HTTPError as exc:
            results["webhook"] = f"{_where(url)} did not answer ({type(exc).__name__})"
    elif spec.webhook_env:
        results["webhook"] = f"${spec.webhook_env} is not set in the watcher's environment"
    return results

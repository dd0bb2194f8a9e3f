"""Lyceum's serverless Docker runs ("executions"): start one, read its state and logs, abort it.

The documented API (docs.lyceum.technology, 2026): `POST /execution/image/start` with
`docker_image_ref`, `docker_run_cmd` (a list), `docker_run_env` (one string of `KEY=value` lines),
`execution_type` (e.g. `gpu.a100`), `timeout` (1-600; its unit is not stated), `enable_s3_mount`
(the account's bucket at /mnt/s3); answer `{execution_id, status, streaming_url}`. Then
`GET /execution/{id}` (status, stdout, stderr, result), `GET /logs/execution/{id}?limit=&hours=`
(`{logs: [{timestamp, message, level, ...}], total}`) and `POST /workloads/abort/{id}`.

States: pending -> starting -> running -> completed | failed | system_failure | cancelled | aborted;
older clients also see queued, failed_user, failed_system and timeout, read here as their current
names. Secrets reach the container only inside `docker_run_env`: they are resolved by name from the
controller's environment at submit time, and scrubbed from every error this module raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from glue.cloud.lyceum.api import LyceumClient, LyceumError
from glue.errors import GlueError
from glue.shell_secrets import from_shell


def _route(*parts: str) -> str:
    """An API path under the external prefix (an API route: never a bucket key)."""
    return "/" + "/".join(parts)


START = _route("execution", "image", "start")
MAX_TIMEOUT = 600  # the documented range of `timeout` is 1-600
ACTIVE = frozenset({"pending", "starting", "running"})
ENDED = frozenset({"completed", "failed", "system_failure", "cancelled", "aborted", "timeout"})
# Older clients' names for the same states.
ALIASES = {"queued": "pending", "failed_user": "failed", "failed_system": "system_failure"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXECUTION_TYPE = re.compile(r"^[a-zA-Z0-9_.]+$")  # the documented pattern


def state_of(raw: Any) -> str:
    """An execution's state in the current names; "unknown" for anything else (never guessed ended)."""
    name = str(raw or "").strip().lower()
    name = ALIASES.get(name, name)
    return name if name in ACTIVE | ENDED else "unknown"


@dataclass(frozen=True)
class Submission:
    """One execution to start: the container, its command and environment, the machine and its cap."""

    image: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names resolved from the controller's environment at submit time
    execution_type: str = "cpu"
    timeout: int = MAX_TIMEOUT
    mount_bucket: bool = True

    def problems(self) -> list[str]:
        out = []
        if not self.image.strip():
            out.append("an execution needs an image (`image:` in run.yaml)")
        if not self.command:
            out.append("an execution needs a command")
        if not _EXECUTION_TYPE.match(self.execution_type):
            out.append(f"execution type {self.execution_type!r} is not a Lyceum execution type (e.g. gpu.a100)")
        if not 1 <= self.timeout <= MAX_TIMEOUT:
            out.append(f"timeout {self.timeout} is outside Lyceum's 1..{MAX_TIMEOUT}")
        out += [f"environment name {k!r} is not a variable name" for k in [*self.env, *self.secrets]
                if not _ENV_NAME.match(k)]
        out += [f"environment value of {k} spans lines (docker_run_env is one KEY=value per line)"
                for k, v in self.env.items() if "\n" in v or "\r" in v]
        return out

    def secret_values(self, environ: dict[str, str] | None = None) -> dict[str, str]:
        values = from_shell(self.secrets, "submit again", environ)
        bad = [name for name, value in values.items() if "\n" in value or "\r" in value]
        if bad:
            raise GlueError(f"secret {', '.join(bad)} spans lines; docker_run_env holds one KEY=value per line")
        return values

    def body(self, environ: dict[str, str] | None = None) -> dict[str, Any]:
        problems = self.problems()
        if problems:
            raise GlueError(f"cannot submit the execution: {problems[0]}")
        env = {**self.env, **self.secret_values(environ)}
        return {"docker_image_ref": self.image, "docker_run_cmd": list(self.command),
                "docker_run_env": "\n".join(f"{k}={v}" for k, v in env.items()),
                "execution_type": self.execution_type, "timeout": self.timeout,
                "enable_s3_mount": self.mount_bucket}


@dataclass(frozen=True)
class Execution:
    id: str
    state: str
    streaming_url: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class Executions:
    """The runs API on an authenticated client."""

    def __init__(self, client: LyceumClient) -> None:
        self.client = client

    def start(self, sub: Submission, environ: dict[str, str] | None = None) -> Execution:
        """Start one execution. Not retried once it may have been sent: a second start would run the job
        twice (a lost answer is an error that says to look at the account's runs first)."""
        body = sub.body(environ)
        secrets = list(sub.secret_values(environ).values())
        try:
            doc = self.client.request("POST", START, body, idempotent=False)
        except LyceumError as exc:
            maybe = "" if exc.status is not None and exc.status < 500 else \
                "; it may have started anyway: check `lyceum workloads list` before submitting again"
            raise GlueError(_scrub(str(exc), secrets) + maybe) from None
        ex_id = str((doc or {}).get("execution_id") or "") if isinstance(doc, dict) else ""
        if not ex_id:
            raise GlueError("Lyceum accepted the execution but returned no execution_id; check `lyceum workloads "
                            "list` before submitting again")
        return Execution(ex_id, state_of(doc.get("status")) if doc.get("status") else "pending",
                         str(doc.get("streaming_url") or ""))

    def get(self, ex_id: str) -> Execution:
        doc = self.client.request("GET", _route("execution", ex_id))
        if not isinstance(doc, dict):
            raise GlueError(f"Lyceum answered GET /execution/{ex_id} with an unexpected shape")
        return Execution(ex_id, state_of(doc.get("status")), detail=doc)

    def logs(self, ex_id: str, limit: int = 1000, hours: int = 24) -> list[str]:
        """Log messages, oldest first (limit 1-10000, hours 1-168 as documented)."""
        query = {"limit": str(max(1, min(limit, 10000))), "hours": str(max(1, min(hours, 168)))}
        doc = self.client.request("GET", _route("logs", "execution", ex_id), query=query)
        rows = doc.get("logs") if isinstance(doc, dict) else None
        entries = [r for r in rows or [] if isinstance(r, dict)]
        entries.sort(key=lambda r: str(r.get("timestamp") or ""))
        return [str(r.get("message") or "") for r in entries]

    def abort(self, ex_id: str) -> None:
        """Hard-stop it (state aborted). An execution that has ended already is left as it is."""
        try:
            self.client.request("POST", _route("workloads", "abort", ex_id), {}, idempotent=True)
        except LyceumError as exc:
            if exc.status not in (400, 409):
                raise
            if not self.get(ex_id).ended:
                raise


def _scrub(text: str, secrets: list[str]) -> str:
    for value in secrets:
        if value:
            text = text.replace(value, "***")
    return text

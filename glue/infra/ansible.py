"""Run the Ansible playbooks (ansible/site.yml, ansible/verify.yml) with ansible-runner.

`converge` prepares the VMs (NVIDIA driver, container runtime, the bucket at /mnt/s3, the trainer
runtime); `verify` asserts that state and returns one summary per host. Both show a live
host x stage table fed from ansible-runner's events.

Secrets: bucket credentials never pass through here. The roles read the 0600 credentials file
with a lookup in no_log tasks, so ansible-runner's events and stdout carry "censored" instead;
extravars go on the command line and must never hold secrets; and the environment handed to
ansible-playbook (which ansible-runner also writes to artifacts/<ident>/command) is cut down to
what Ansible needs, so API keys in the caller's environment do not land on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from glue.errors import GlueError
from glue.paths import PROJECT_ROOT, venv_bin

ANSIBLE_DIR = PROJECT_ROOT / "ansible"
SITE = "site.yml"
VERIFY = "verify.yml"
ARTIFACTS_KEPT = 20
SUMMARY_FACT = "gpukit_summary"

# What ansible-playbook may see of our environment (prefixes, then exact names).
_ENV_PREFIXES = ("ANSIBLE_", "AWX_", "RUNNER_", "LC_")
_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
     "GPUKIT_HOME", "JOB_ID", "PROOT_TMP_DIR"}
)
# A UNIX socket path holds at most 108 bytes; ssh adds ".XXXXXXXXXXXXXXXX" while creating it and
# ansible.cfg names sockets %h-%p-%r ("127.0.0.1-65535-root" and the like).
_SOCKET_PATH_MAX = 100
_SOCKET_NAME_RESERVE = 48


@dataclass
class PlaybookResult:
    """The outcome of one playbook run."""

    ok: bool
    changed: dict[str, int]
    failed: dict[str, str] = field(default_factory=dict)  # host -> "task name: message" (first failure)
    seconds: float = 0.0
    rc: int = 0
    status: str = ""
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # verify.yml's per-host summary
    artifact_dir: str = ""


# -- paths -------------------------------------------------------------------------------------
def inventory_file(home: Path) -> Path:
    return home / "ansible" / "inventory.yml"


def runner_dir(home: Path) -> Path:
    return home / "ansible" / "runner"


def control_path_dir(home: Path) -> Path:
    """SSH control sockets: under <home>/ansible/cp, or a short per-home dir when that is too long."""
    preferred = home / "ansible" / "cp"
    if len(str(preferred)) + _SOCKET_NAME_RESERVE <= _SOCKET_PATH_MAX:
        return preferred
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    return Path("/tmp") / f"gpukit-cp-{digest}"


def facts_dir(home: Path) -> Path:
    return home / "ansible" / "facts"


def _prune_fact_cache(home: Path, inventory: Path) -> None:
    """Keep cached facts only for hosts still on the same VM (a replaced VM must be looked at anew)."""
    cache = facts_dir(home)
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    ids_file = cache / ".vm-ids.json"
    try:
        hosts = (yaml.safe_load(inventory.read_text()) or {}).get("all", {}).get("hosts") or {}
        known = json.loads(ids_file.read_text()) if ids_file.exists() else {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        hosts, known = {}, {}
    def drop(host: str) -> None:
        # ansible-core names the files <prefix><host>, the prefix carrying a schema id ("s1_").
        for f in cache.iterdir():
            if f.name == host or re.fullmatch(r"s\d+_" + re.escape(host), f.name):
                f.unlink(missing_ok=True)

    current: dict[str, str] = {}
    for name, hv in hosts.items():
        vm_id = str((hv or {}).get("gpukit_vm_id") or "")
        if not (vm_id and known.get(name) == vm_id):
            drop(str(name))  # a new or replaced VM, or no id to tell: gather its facts anew
        if vm_id:
            current[name] = vm_id
    for stale in set(known) - set(hosts):
        drop(str(stale))
    ids_file.write_text(json.dumps(current, sort_keys=True))


def summary_file(home: Path) -> Path:
    return home / "ansible" / "verify.json"


def _runner_env(home: Path) -> dict[str, str]:
    cp = control_path_dir(home)
    cp.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = home / "ansible" / "tmp"
    tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    # ansible-playbook from our venv first (ansible-runner finds it on PATH).
    path = os.pathsep.join([str(venv_bin()), os.environ.get("PATH", "/usr/bin:/bin")])
    return {
        "PATH": path,
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        # ansible-runner turns host key checking off unless told otherwise: keep it on.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp),
        "ANSIBLE_LOCAL_TEMP": str(tmp),
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts_dir(home)),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
        "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
        "GPUKIT_HOME": str(home),
    }


def _filtered_env(env: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items() if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


# -- progress ------------------------------------------------------------------------------------
@dataclass
class _HostState:
    stage: str = ""
    task: str = ""
    done: int = 0
    changed: int = 0
    state: str = "waiting"  # waiting | running | ok | failed | unreachable
    stages: dict[str, str] = field(default_factory=dict)  # stage -> running | ok | changed | failed


_STAGE_LABEL = {"play": "facts", "nvidia_driver": "driver", "container_runtime": "docker",
                "bucket_mount": "/mnt/s3", "trainer": "trainer"}
_STAGE_STYLE = {"running": ("…", "yellow"), "ok": ("✓", "green"), "changed": ("✓", "cyan"),
                "failed": ("✗", "bold red"), "skipped": ("-", "dim")}


class _Progress:
    """Collects runner events; renders a host x stage table (stages = roles, in order seen)."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.play = ""
        self.started = time.monotonic()
        self.hosts: dict[str, _HostState] = {}
        self.stages: list[str] = []
        self.failed: dict[str, str] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.stats: dict[str, Any] = {}
        self.lock = threading.Lock()

    def _host(self, name: str) -> _HostState:
        return self.hosts.setdefault(name, _HostState())

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        with self.lock:
            if kind == "playbook_on_play_start":
                self.play = str(data.get("play", ""))
            elif kind == "runner_on_start":
                self._on_start(data)
            elif kind in ("runner_on_ok", "runner_on_skipped", "runner_on_failed", "runner_on_unreachable"):
                self._on_result(kind, data)
            elif kind == "playbook_on_stats":
                self.stats = data
        return True  # keep the event in the artifacts

    def _stage(self, data: Mapping[str, Any]) -> str:
        stage = str(data.get("role") or "play")
        if stage not in self.stages:
            self.stages.append(stage)
        return stage

    def _on_start(self, data: Mapping[str, Any]) -> None:
        h = self._host(str(data.get("host", "?")))
        h.stage = self._stage(data)
        h.task = str(data.get("task", ""))
        if h.state in ("waiting", "ok"):
            h.state = "running"
        if h.stages.get(h.stage) not in ("failed", "changed"):
            h.stages[h.stage] = "running"

    def _on_result(self, kind: str, data: Mapping[str, Any]) -> None:
        host = str(data.get("host", "?"))
        h = self._host(host)
        stage = self._stage(data)
        res = data.get("res") or {}
        h.done += 1
        if kind == "runner_on_ok":
            if res.get("changed"):
                h.changed += 1
                h.stages[stage] = "changed"
            elif h.stages.get(stage) in (None, "running"):
                h.stages[stage] = "ok"
            facts = res.get("ansible_facts") or {}
            if isinstance(facts.get(SUMMARY_FACT), dict):
                self.summaries[host] = facts[SUMMARY_FACT]
        elif kind == "runner_on_skipped":
            if h.stages.get(stage) in (None, "running"):
                h.stages[stage] = "ok"
        elif kind == "runner_on_failed" and data.get("ignore_errors"):
            pass
        else:
            h.stages[stage] = "failed"
            h.state = "unreachable" if kind == "runner_on_unreachable" else "failed"
            if host not in self.failed:
                label = "unreachable" if kind == "runner_on_unreachable" else str(data.get("task", "?"))
                self.failed[host] = f"{label}: {failure_message(res)}"

    def finish(self) -> None:
        with self.lock:
            for host, n in (self.stats.get("changed") or {}).items():
                if host in self.hosts:
                    self.hosts[host].changed = int(n)  # no_log results hide `changed` from the events
            for h in self.hosts.values():
                if h.state == "running":
                    h.state = "ok"
                for stage, st in h.stages.items():
                    if st == "running":
                        h.stages[stage] = "ok"

    def render(self) -> Group:
        with self.lock:
            table = Table(title=None, expand=False, show_edge=False, pad_edge=False)
            table.add_column("host", style="bold")
            for stage in self.stages:
                table.add_column(_STAGE_LABEL.get(stage, stage), justify="center")
            table.add_column("tasks", justify="right")
            table.add_column("changed", justify="right")
            table.add_column("now", overflow="fold")
            for name in sorted(self.hosts):
                h = self.hosts[name]
                cells: list[Text | str] = [name]
                for stage in self.stages:
                    mark, style = _STAGE_STYLE.get(h.stages.get(stage, ""), ("", ""))
                    cells.append(Text(mark, style=style))
                now = h.task if h.state == "running" else h.state
                if h.state in ("failed", "unreachable"):
                    now = self.failed.get(name, h.state)
                cells += [str(h.done), str(h.changed), Text(now[:90], style="red" if name in self.failed else "")]
                table.add_row(*cells)
            head = Text(f"{self.title} — {self.play}  {time.monotonic() - self.started:5.1f}s", style="bold")
            return Group(head, table)


# What ssh itself adds to a raw task's stderr when a multiplexed session ends.
_SSH_NOISE = re.compile(r"^(Shared connection|Connection) to \S+ closed\.$")


def failure_message(res: Mapping[str, Any]) -> str:
    """One line from a failed task's result: its msg, plus the last line of stderr for commands."""
    if not isinstance(res, Mapping):
        return str(res)
    if res.get("censored"):
        return "output hidden (no_log)"
    msg = str(res.get("msg") or "").strip()
    output = [str(res.get(k) or "") for k in ("stderr", "stdout")]  # stdout: a raw task under a pty
    if any(output) and (not msg or msg == "non-zero return code" or res.get("failed_when_result")):
        for text in output:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not _SSH_NOISE.match(ln.strip())]
            if lines:
                return lines[-1] if not msg or msg == "non-zero return code" else f"{msg}: {lines[-1]}"
    if not msg and res.get("results"):  # a loop: the first failed item
        for item in res["results"]:
            if isinstance(item, Mapping) and item.get("failed"):
                return failure_message(item)
    return " ".join(msg.split()) or json.dumps(res)[:300]


# -- running -------------------------------------------------------------------------------------
def run_playbook(
    playbook: str,
    home: Path,
    limit: list[str] | None = None,
    extravars: dict[str, Any] | None = None,
    progress: bool = True,
) -> PlaybookResult:
    """Run ansible/<playbook> against <home>/ansible/inventory.yml; never raises for a failed play."""
    import ansible_runner  # heavy; only loaded when a playbook runs

    book = Path(playbook) if Path(playbook).is_absolute() else ANSIBLE_DIR / playbook
    if not book.is_file():
        raise GlueError(f"no playbook {book}")
    inventory = inventory_file(home)
    if not inventory.is_file():
        raise GlueError(f"no Ansible inventory at {inventory}; run `glue up` (or `make up`) first")
    _prune_fact_cache(home, inventory)
    pdd = runner_dir(home)
    pdd.mkdir(mode=0o700, parents=True, exist_ok=True)
    ident = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}-{book.stem}"
    tracker = _Progress(f"ansible {book.name}")
    kwargs: dict[str, Any] = {
        "private_data_dir": str(pdd),
        "playbook": str(book),
        "inventory": str(inventory),
        "ident": ident,
        "envvars": _runner_env(home),
        "extravars": dict(extravars or {}),
        "limit": ",".join(limit) if limit else None,
        "quiet": True,
        "suppress_env_files": True,  # nothing of ours written under env/ (and nothing stale read back)
        "fact_cache_type": "memory",  # not in the artifacts: our own per-VM cache (ANSIBLE_CACHE_PLUGIN_*)
        "rotate_artifacts": ARTIFACTS_KEPT,
        "event_handler": tracker.handle,
    }
    runner = ansible_runner.interface.init_runner(**kwargs)
    runner.config.env = _filtered_env(runner.config.env)
    started = time.monotonic()
    if progress:
        # Live re-renders the table from its own thread (get_renderable) while runner.run() feeds events.
        with Live(console=Console(stderr=True), get_renderable=tracker.render, refresh_per_second=4,
                  transient=False) as live:
            try:
                runner.run()
            finally:
                tracker.finish()
                live.refresh()
    else:
        runner.run()
        tracker.finish()
    seconds = time.monotonic() - started
    stats = tracker.stats
    hosts = set(tracker.hosts)
    for key in ("ok", "changed", "failures", "dark", "skipped", "processed"):
        hosts.update((stats.get(key) or {}).keys())
    changed = {h: int((stats.get("changed") or {}).get(h, 0)) for h in sorted(hosts)}
    failed = dict(tracker.failed)
    for h, n in (stats.get("failures") or {}).items():
        if n and h not in failed:
            failed[h] = "failed (see the ansible-runner artifacts)"
    for h, n in (stats.get("dark") or {}).items():
        if n and h not in failed:
            failed[h] = "unreachable"
    rc = int(runner.rc if runner.rc is not None else -1)
    status = str(runner.status)
    if rc != 0 and not failed:
        failed["*"] = f"ansible-playbook exited {rc} ({status}); see {runner.config.artifact_dir}/stdout"
    return PlaybookResult(
        ok=rc == 0 and status == "successful" and not failed,
        changed=changed,
        failed=failed,
        seconds=round(seconds, 2),
        rc=rc,
        status=status,
        summaries=dict(tracker.summaries),
        artifact_dir=str(runner.config.artifact_dir),
    )


def converge(home: Path, limit: list[str] | None = None, progress: bool = True) -> PlaybookResult:
    """Run site.yml: driver, container runtime, the bucket at /mnt/s3, the trainer runtime."""
    return run_playbook(SITE, home, limit=limit, progress=progress)


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


def result_dict(result: PlaybookResult) -> dict[str, Any]:
    return asdict(result)

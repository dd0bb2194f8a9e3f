"""Run a playbook from ansible/ with ansible-runner and reduce its events to a `PlaybookResult`.

`converge` runs site.yml (NVIDIA driver, container runtime, the bucket at /mnt/s3, the trainer
runtime); `run_playbook` runs any playbook against <home>/ansible/inventory.yml, showing the live
host x stage table of `ansible_progress` while it runs.

Secrets: bucket credentials never pass through here. The roles read the 0600 credentials file
with a lookup in no_log tasks, so ansible-runner's events and stdout carry "censored" instead;
extravars go on the command line and must never hold secrets; and the environment handed to
ansible-playbook (which ansible-runner also writes to artifacts/<ident>/command) is cut down to
what Ansible needs, so API keys in the caller's environment do not land on disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from glue.errors import GlueError
from glue.infra.ansible_progress import Progress, live
from glue.infra.inventory import inventory_path
from glue.infra.source_hash import WHEEL_DIR, prune_wheel_dirs, source_hash
from glue.paths import PROJECT_ROOT, venv_bin

ANSIBLE_DIR = PROJECT_ROOT / "ansible"
SITE = "site.yml"
ARTIFACTS_KEPT = 20

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


def prune_fact_cache(home: Path, inventory: Path) -> None:
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


# -- environment -------------------------------------------------------------------------------
def runner_env(home: Path) -> dict[str, str]:
    """What ansible-playbook runs with (besides the filtered caller's environment): our venv first on
    PATH, ansible.cfg, strict host keys, the per-home control sockets, temp dir and fact cache."""
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
        **_strategy_env(),
    }


def _strategy_env() -> dict[str, str]:
    """Mitogen's strategy: one persistent Python interpreter per VM instead of a fresh AnsiballZ
    process per task (measured here: 10 tasks on one VM 10 s -> 4.7 s; site.yml on 2 fresh VMs 0.77x
    of the stock strategy in one bench/converge.py run). Its plugin path lives in our venv, so it is
    set here, not in ansible.cfg.
    GPUKIT_ANSIBLE_STRATEGY=linear runs Ansible's own strategy instead (a module Mitogen mishandles;
    bench/converge.py's baseline)."""
    choice = os.environ.get("GPUKIT_ANSIBLE_STRATEGY", "mitogen")
    if choice == "linear":
        return {"ANSIBLE_STRATEGY": "linear"}
    if choice != "mitogen":
        raise GlueError(f"GPUKIT_ANSIBLE_STRATEGY={choice!r}: use mitogen (the default) or linear")
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or spec.origin is None:
        raise GlueError("mitogen is not installed in gpukit's venv; run `make bootstrap` to fix it")
    plugins = Path(spec.origin).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear"}


def _filtered_env(env: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items() if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


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
    inventory = inventory_path(home)
    if not inventory.is_file():
        raise GlueError(f"no Ansible inventory at {inventory}; run `glue up` (or `make up`) first")
    prune_fact_cache(home, inventory)
    pdd = runner_dir(home)
    pdd.mkdir(mode=0o700, parents=True, exist_ok=True)
    ident = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}-{book.stem}"
    tracker = Progress(f"ansible {book.name}")
    kwargs: dict[str, Any] = {
        "private_data_dir": str(pdd),
        "playbook": str(book),
        "inventory": str(inventory),
        "ident": ident,
        "envvars": runner_env(home),
        "extravars": dict(extravars or {}),
        "limit": ",".join(limit) if limit else None,
        "quiet": True,
        "suppress_env_files": True,  # nothing of ours written under env/ (and nothing stale read back)
        "fact_cache_type": "memory",  # not in the artifacts: our own per-VM cache (ANSIBLE_CACHE_PLUGIN_*)
        "rotate_artifacts": ARTIFACTS_KEPT,
        "event_handler": tracker.handle,
    }
    with signals_cancel() as cancelled:
        # Our own cancel callback: left without one, ansible-runner installs SIGINT/SIGTERM handlers for
        # the rest of the process, and Ctrl-C or `glue watch --stop` would never end it again.
        runner = ansible_runner.interface.init_runner(**kwargs, cancel_callback=cancelled)
        runner.config.env = _filtered_env(runner.config.env)
        started = time.monotonic()
        with live(tracker, show=progress):
            runner.run()
        seconds = time.monotonic() - started
        if runner.canceled or runner.timed_out or runner.errored:
            kill_orphans(list(runner.config.command or []))
    return _result(tracker, runner, seconds)


def kill_orphans(command: list[str], proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL what a stopped ansible-playbook left behind. ansible-runner stops it by killing its process
    group, but Mitogen's connection multiplexer is a fork of it in a session of its own: it survives,
    orphaned (its parent now init), and never exits. Only such orphans running this very command line
    (`python .../ansible-playbook <the same arguments>`) are killed."""
    if len(command) < 2:
        return []
    program, args = Path(command[0]).name, [a.encode() for a in command[1:]]
    killed = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        head = argv[:len(argv) - len(args)]
        if ppid != 1 or argv[len(head):] != args or not any(Path(a.decode(errors="replace")).name == program
                                                              for a in head):
            continue
        try:
            os.kill(int(d.name), signal.SIGKILL)
            killed.append(int(d.name))
        except ProcessLookupError:
            continue
    return killed


@contextmanager
def signals_cancel() -> Iterator[Callable[[], bool]]:
    """While a playbook runs, SIGINT/SIGTERM cancel it (ansible-runner stops ansible-playbook); then the
    previous handlers are back, and a signal that came is delivered to them (Ctrl-C raises
    KeyboardInterrupt, a watcher's SIGTERM ends it) once the playbook has stopped."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        yield lambda: False
        return
    got: list[int] = []
    previous = {sig: h for sig in (signal.SIGINT, signal.SIGTERM) if (h := signal.getsignal(sig)) is not signal.SIG_IGN}
    for sig in previous:
        signal.signal(sig, lambda signum, _frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if got:
        signal.raise_signal(got[0])


def _result(tracker: Progress, runner: Any, seconds: float) -> PlaybookResult:
    """The run's outcome: the events as collected, completed from the final stats and exit status."""
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


def converge_vars() -> dict[str, str]:
    """The extra variables of every run of site.yml: which wheel the trainer role installs (and where
    it is cached; older trees' wheels pruned)."""
    digest = source_hash()
    prune_wheel_dirs(WHEEL_DIR, keep=digest)
    return {"gpukit_source_hash": digest, "trainer_wheel_dir": str(WHEEL_DIR)}


def converge(home: Path, limit: list[str] | None = None, progress: bool = True,
             playbook: str = SITE) -> PlaybookResult:
    """Run site.yml (or `playbook`, which imports it): driver, container runtime, the bucket at /mnt/s3,
    the trainer runtime."""
    return run_playbook(playbook, home, limit=limit, progress=progress, extravars=converge_vars())

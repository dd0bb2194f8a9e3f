"""The one module that drives the terraform CLI, through its `-json` machine-readable output.

Each backend's root config (terraform/envs/<backend>) is copied into <home>/terraform/<backend>/ and
run there, so state, lock file and .terraform/ belong to the kit home, not the source tree. The
modules it calls (terraform/modules/<name>, as source "../../modules/<name>") are copied to
<home>/terraform/modules/<name>/, and that source reads "../modules/<name>" in the copy: the
working dir sits one level less deep than terraform/envs/<backend>.
Variables travel in a tfvars.json file, not on the command line.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from glue.cloud.base import SPARE_MARK
from glue.errors import GlueError, NoCapacity
from glue.infra import user_module
from glue.paths import PROJECT_ROOT
from glue.tfprovider.install import install

ENVS_DIR = PROJECT_ROOT / "terraform" / "envs"
MODULES_DIR = PROJECT_ROOT / "terraform" / "modules"
# Where the envs' VMs live in the state (terraform/modules/cluster, called as "cluster").
VM_RESOURCE = "module.cluster.gpukit_vm.node"
SPARE_RESOURCE = "module.cluster.gpukit_vm.spare"
# An env's call of one of our modules: `source = "../../modules/<name>"`.
_MODULE_SOURCE = re.compile(r'^(\s*source\s*=\s*")\.\./\.\./modules/', re.MULTILINE)


def vm_address(name: str) -> str:
    """The resource address of VM `name` (for `Terraform.apply(replace=...)`), a warm spare's included."""
    return f'{SPARE_RESOURCE if is_spare(name) else VM_RESOURCE}["{name}"]'


def is_spare(name: str) -> bool:
    """A warm spare's name (<prefix>-spare-<k>); a cluster VM's is <prefix>-<i>."""
    prefix, mark, k = name.rpartition(SPARE_MARK)
    return bool(prefix and mark and k.isdigit())


@dataclass
class ResourceProgress:
    """Live status of one resource during apply/destroy."""

    action: str = ""
    state: str = "pending"
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None


def _terraform_binary() -> str:
    found = shutil.which("terraform")
    if not found:
        raise GlueError(
            "terraform is not on PATH; install Terraform >= 1.5 (a single binary) and run the command again"
        )
    return found


_LOCKS_GUARD = threading.Lock()
_LOCK_DEPTH: dict[str, int] = {}


class _Interrupts:
    """While terraform runs (main thread only): the first SIGINT/SIGTERM is passed to terraform as one
    SIGINT, later ones are counted and ignored."""

    def __init__(self, proc: subprocess.Popen[str], console: Console) -> None:
        self.proc, self.console, self.count = proc, console, 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.proc.send_signal(signal.SIGINT)
            self.console.print("[yellow]interrupt:[/] terraform is finishing what is in flight and recording it "
                               "in the state; pressing Ctrl-C again does not speed this up")

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Terraform:
    def __init__(self, home: Path, backend: str, console: Console | None = None) -> None:
        self.home = home
        self.backend = backend
        self.src = ENVS_DIR / backend
        if not self.src.is_dir():
            raise GlueError(f"no Terraform env for backend {backend!r} (expected {self.src})")
        self.workdir = home / "terraform" / backend
        self.console = console or Console(stderr=True)
        self.binary = _terraform_binary()
        self.user = backend == user_module.BACKEND  # the user's own module (glue/infra/user_module.py)
        self.applied = False  # an apply by this instance succeeded: its outputs are held to the contract

    # -- plumbing ------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TF_CLI_CONFIG_FILE": str(install(self.home)),
                "GPUKIT_HOME": str(self.home),
                "TF_IN_AUTOMATION": "1",
                "TF_INPUT": "0",
                "CHECKPOINT_DISABLE": "1",
            }
        )
        env.pop("TF_LOG", None)
        return env

    def _sync(self) -> None:
        """Copy the env's .tf files into the working dir and the modules beside it (see the module doc)."""
        place = user_module.place(self.home) if self.user else str
        _sync_tf(self.src, self.workdir, lambda text: place(_MODULE_SOURCE.sub(r"\1../modules/", text)))
        modules = self.workdir.parent / "modules"
        wanted = {d.name for d in MODULES_DIR.iterdir() if d.is_dir()} if MODULES_DIR.is_dir() else set()
        for name in sorted(wanted):
            _sync_tf(MODULES_DIR / name, modules / name)
        if modules.is_dir():
            for old in modules.iterdir():
                if old.is_dir() and old.name not in wanted:
                    shutil.rmtree(old)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One terraform run per kit home and backend at a time (a second waits, saying so), across
        processes: two recovers or a `glue up` during a `glue down` must not race on the state.
        Re-entrant within a process."""
        path = self.home / "terraform" / f".{self.backend}.lock"
        key = str(path)
        with _LOCKS_GUARD:
            depth = _LOCK_DEPTH.get(key, 0)
            _LOCK_DEPTH[key] = depth + 1
        if depth:
            try:
                yield
            finally:
                with _LOCKS_GUARD:
                    _LOCK_DEPTH[key] -= 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.console.print(f"[yellow]waiting[/] for another glue command's terraform run in {self.home}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with _LOCKS_GUARD:
                _LOCK_DEPTH[key] -= 1
            os.close(fd)  # releases the flock

    def _stream(self, args: list[str]) -> Iterator[dict[str, Any]]:
        """Run terraform with -json and yield its messages; raise GlueError on failure.

        Terraform runs in its own session, so a Ctrl-C at the terminal reaches glue only. glue passes ONE
        interrupt on (terraform then finishes the resources in flight and writes them to the state) and
        ignores the rest: a second SIGINT straight to terraform would make it exit at once and forget VMs
        it had already created."""
        proc = subprocess.Popen(
            [self.binary, *args], cwd=self.workdir, env=self._env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        interrupted = _Interrupts(proc, self.console)
        errors: list[str] = []
        with interrupted:
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("type") == "diagnostic" and msg.get("diagnostic", {}).get("severity") == "error":
                    errors.append(_diag_line(msg["diagnostic"]))
                yield msg
            stderr = proc.stderr.read()
            code = proc.wait()
        if interrupted.count:
            raise GlueError(f"interrupted: terraform {args[0]} stopped after recording what it had done in the "
                            "state; `glue up` finishes the cluster, `glue down` removes it")
        if code != 0:
            detail = "; ".join(dict.fromkeys(errors)) or stderr.strip().splitlines()[-1:] or ["unknown error"]
            text = detail if isinstance(detail, str) else " ".join(detail)
            text = user_module.explain(text) if self.user else text
            kind = NoCapacity if NoCapacity.said_in(text) else GlueError  # the provider's kind of error, kept
            raise kind(f"terraform {args[0]} failed: {text}")

    def _vars_file(self, variables: dict[str, Any]) -> Path:
        path = self.workdir / "gpukit.auto.tfvars.json"
        path.write_text(json.dumps(variables, indent=2))
        return path

    # -- commands ------------------------------------------------------------------------------
    def init(self) -> None:
        self._sync()
        for _ in self._stream(["init", "-json", "-input=false", "-upgrade"]):
            pass

    def apply(self, variables: dict[str, Any], destroy: bool = False,
              replace: list[str] | None = None, target: list[str] | None = None) -> dict[str, ResourceProgress]:
        """terraform apply (or destroy) with a live per-resource progress table; `replace` forces new
        instances of the given resource addresses (a VM to abandon even though it still runs: see
        `vm_address`). Terraform ignores an address that names nothing, so that is an error here.
        `target` (with destroy): destroy only those VMs (and what depends on them)."""
        with self.locked():
            return self._apply(variables, destroy, replace, target)

    def _apply(self, variables: dict[str, Any], destroy: bool,
               replace: list[str] | None, target: list[str] | None = None) -> dict[str, ResourceProgress]:
        self.init()
        self._vars_file(variables)
        args = ["apply", "-json", "-input=false", "-auto-approve"] + (["-destroy"] if destroy else [])
        if self.user and not destroy:
            replace = user_module.replacing(self.home, replace or [], self.state_ids())
        args += [f"-replace={addr}" for addr in replace or []]
        args += [f"-target={addr}" for addr in self._real(target or [])]
        rows: dict[str, ResourceProgress] = {}
        try:
            with Live(_table(rows), console=self.console, refresh_per_second=8, transient=False) as live:
                for msg in self._stream(args):
                    _track(rows, msg)
                    live.update(_table(rows))
        finally:
            if not self.console.is_terminal:
                self.console.print()  # so a following error line starts on a line of its own
        untouched = [addr for addr in replace or [] if addr not in rows]
        if untouched and not destroy:
            raise GlueError(f"terraform replaced nothing at {', '.join(untouched)}: no such resource "
                            f"(a VM's address is {vm_address('<name>')})")
        self.applied = not destroy
        return rows

    def _output(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "output", "-json", "-no-color"], cwd=self.workdir, env=self._env(),
            capture_output=True, text=True, check=False,
        )

    def plan_changes(self, variables: dict[str, Any]) -> list[tuple[str, str]]:
        """(address, action) for every change a plan would make."""
        self.init()
        self._vars_file(variables)
        changes = []
        for msg in self._stream(["plan", "-json", "-input=false"]):
            if msg.get("type") == "planned_change":
                ch = msg["change"]
                changes.append((ch["resource"]["addr"], ch["action"]))
        return changes

    def state_rm(self, address: str) -> None:
        """Terraform lets go of a resource without destroying it (the next apply creates a new one under
        its address). Call under locked()."""
        self._state("rm", *self._real([address]))

    def state_mv(self, source: str, destination: str) -> None:
        """The resource at `source` is from now on the one at `destination` (nothing is created or
        destroyed). Call under locked()."""
        self._state("mv", *self._real([source, destination]))

    def _real(self, addresses: list[str]) -> list[str]:
        return user_module.real(self.home, addresses, self.state_ids()) if self.user else addresses

    def state_ids(self) -> dict[str, str]:
        """{resource address: its id} of every managed resource in the state."""
        if not (self.workdir / "terraform.tfstate").exists():
            return {}
        proc = subprocess.run([self.binary, "show", "-json", "-no-color"], cwd=self.workdir, env=self._env(),
                              capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise GlueError(f"terraform show failed: {' '.join(proc.stderr.split())[-300:]}")
        root = (json.loads(proc.stdout or "{}").get("values") or {}).get("root_module") or {}
        modules = [root]
        out: dict[str, str] = {}
        while modules:
            mod = modules.pop()
            modules += mod.get("child_modules") or []
            out.update({r["address"]: str((r.get("values") or {}).get("id")) for r in mod.get("resources") or []
                        if r.get("mode") == "managed"})
        return out

    def _state(self, *args: str) -> str:
        proc = subprocess.run([self.binary, "state", args[0], "-no-color", *args[1:]], cwd=self.workdir,
                              env=self._env(), capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise GlueError(f"terraform state {' '.join(args)} failed: {' '.join(proc.stderr.split())[-300:]}")
        return proc.stdout

    def outputs(self) -> dict[str, Any]:
        if not (self.workdir / "terraform.tfstate").exists():
            return {}
        out = self._output()
        if out.returncode != 0 and "terraform init" in out.stderr:
            self.init()  # the provider launcher or the env's files changed since the last init
            out = self._output()
        if out.returncode != 0:
            raise GlueError(f"terraform output failed: {' '.join(out.stderr.split())[:300]}")
        found = {k: v["value"] for k, v in json.loads(out.stdout or "{}").items()}
        if self.user:
            say = self.console.print
            return user_module.outputs(self.home, self.workdir, found, self.applied,
                                       lambda line: say(line, highlight=False, markup=False, soft_wrap=True))
        return found


def _sync_tf(src: Path, dst: Path, transform: Callable[[str], str] = str) -> None:
    """Make dst's .tf files those of src (after `transform`): write what differs, remove what src lacks."""
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: transform(p.read_text()) for p in src.glob("*.tf")}
    for old in dst.glob("*.tf"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        path = dst / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def _diag_line(diag: dict[str, Any]) -> str:
    summary = str(diag.get("summary", "")).strip()
    detail = " ".join(str(diag.get("detail", "")).split())
    addr = diag.get("address")
    text = f"{summary}: {detail}" if detail else summary
    return f"{addr}: {text}" if addr else text


def _track(rows: dict[str, ResourceProgress], msg: dict[str, Any]) -> None:
    kind = msg.get("type", "")
    hook = msg.get("hook", {})
    addr = hook.get("resource", {}).get("addr")
    if not addr:
        return
    if kind == "apply_start":
        rows[addr] = ResourceProgress(action=hook.get("action", ""), state="running")
    elif kind == "apply_complete":
        row = rows.setdefault(addr, ResourceProgress(action=hook.get("action", "")))
        row.state, row.seconds = "done", float(hook.get("elapsed_seconds", 0))
    elif kind == "apply_errored":
        row = rows.setdefault(addr, ResourceProgress(action=hook.get("action", "")))
        row.state, row.seconds = "failed", time.monotonic() - row.started


def _table(rows: dict[str, ResourceProgress]) -> Table:
    table = Table(title="terraform", show_edge=False, box=None)
    for col in ("resource", "action", "status", "seconds"):
        table.add_column(col)
    style = {"running": "yellow", "done": "green", "failed": "red"}
    for addr, row in sorted(rows.items()):
        secs = row.seconds if row.seconds is not None else time.monotonic() - row.started
        table.add_row(addr, row.action, f"[{style.get(row.state, '')}]{row.state}[/]", f"{secs:.1f}")
    return table

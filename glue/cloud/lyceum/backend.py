"""The lyceum backend: real GPU VMs and the account's S3 bucket through Lyceum's REST API.

create: check availability -> POST /vms/create -> poll GET /vms/{id}/status (rich progress, a
timeout) until the VM runs and has an address -> read its SSH host key (trust on first use) ->
record. Any failure after the POST deletes the VM again, so nothing is left running and billed;
if even that fails, the error names the VM and the command that deletes it.
read: terminated, error, stopped or missing (404) = gone, so the next apply replaces the VM.
The bucket: POST /storage/credentials; the expiring credentials live in the 0600 file
<home>/bucket/credentials.json and are refreshed before they expire (see lyceum_creds).

Settings (environment): LYCEUM_API_KEY (required), LYCEUM_API_URL, LYCEUM_CREATE_TIMEOUT
(seconds, default 900), LYCEUM_POLL_INTERVAL (default 5), LYCEUM_HARDWARE_PROFILE and
LYCEUM_GPU_COUNT (what `glue up` asks for), LYCEUM_SSH_USER (the user to log in as; unset: root
if the VM accepts it, else the image's default, see login.py), LYCEUM_INSTANCE_SPECS (current | legacy: the shape of
the create's instance_specs, see spec.instance_specs). Usage as a tool:
    python -m glue.cloud.lyceum list | availability | delete <vm_id>
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paramiko
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from glue import paths
from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.checks import Readiness
from glue.cloud.lyceum import bucket as lyceum_creds
from glue.cloud.lyceum import login, pricing
from glue.cloud.lyceum.address import parse_address
from glue.cloud.lyceum.api import (
    GONE_STATUSES,
    LyceumCapacity,
    LyceumClient,
    LyceumNotFound,
)
from glue.cloud.lyceum.capacity import offers, refused, shortfall
from glue.cloud.lyceum.inputs import MARKET_ENV, market, specs_shape, tf_vars
from glue.cloud.lyceum.spec import ON_DEMAND, PROFILES, SPOT, check, instance_specs, market_of
from glue.errors import GlueError, NoCapacity
from glue.paths import ssh_client_key_path

NAME = "lyceum"
SSH_USER = "root"  # what a VM recorded before users were detected logged in as
RUNNING_STATUSES = frozenset({"running", "ready"})
DELETE_COMMAND = "python -m glue.cloud.lyceum delete"  # __main__.py
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise GlueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise GlueError(f"{name} must be positive (got {raw})")
    return value


def scan_host_key(host: str, port: int, timeout: float = 10.0) -> str:
    """The VM's SSH host public key ("type base64"), read over one SSH handshake (no login)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        opts = transport.get_security_options()
        offered = tuple(opts.key_types)
        opts.key_types = tuple(k for k in HOST_KEY_TYPES if k in offered) + tuple(
            k for k in offered if k not in HOST_KEY_TYPES)
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


class LyceumBackend:
    """Backend `lyceum`. The API client is built on first use, so commands that never reach the
    API (an empty destroy) do not need a key."""

    name = NAME
    credentials_expire = True  # STS-style: refreshed near expiry and pushed to the VMs
    bucket_on_host = False
    baked_image: str | None = None  # Lyceum's own image; Ansible installs the rest
    multi_node: str | None = ("Lyceum does not network an account's VMs for one job on its public API (an "
                              "enterprise-contract feature)")
    takes_config_seed = False  # the playbook configures every VM (no user-data in the public API)
    deletes_vms = True

    def check_host(self) -> None:
        """Nothing local beyond terraform and SSH: the VMs are Lyceum's."""

    def readiness(self) -> Readiness:
        """The account (API key, capacity, storage credentials), then each VM of the cluster (address, user):
        glue.cloud.lyceum.doctor."""
        from glue.cloud.lyceum import doctor

        ready = doctor.account(self._client)
        ids = sorted(p.stem for p in self.records.glob("*.json")) if self.records.is_dir() else []
        if not ids or not ready.checks[0].ok:
            return ready
        vms = doctor.cluster_vms(self.api, {i: self._load_record(i) for i in ids}, ssh_client_key_path(self.home))
        return Readiness([*ready.checks, *vms], ready.bucket, ready.credentials)

    def spares_problem(self) -> str | None:
        if market() == SPOT:
            return (f"this cluster's VMs are spot ({MARKET_ENV}=spot): Lyceum may reclaim an idle spare without "
                    "notice, so none can be counted on; use on-demand VMs for spares (unset LYCEUM_MARKET), or "
                    "--spares 0")
        return None

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        """Inputs checked, then capacity: a profile Lyceum cannot serve is refused before terraform
        starts (no VM created, no wait for the create timeout)."""
        tfv = tf_vars(vm_count, name_prefix, ssh_public_key)
        self._check_capacity(tfv["hardware_profile"], tfv["gpu_count"], tfv["market"])
        pricing.refresh(self.home, self.api)
        return tfv

    def __init__(self, home: Path, client: LyceumClient | None = None, console: Console | None = None) -> None:
        self.home = home
        self.records = home / "lyceum" / "vms"
        self.cred_file = home / "bucket" / "credentials.json"
        self._client = client
        self.console = console or Console(stderr=True)
        self._progress_lock = threading.Lock()
        self._progress_users = 0
        self._live: Progress | None = None

    @property
    def api(self) -> LyceumClient:
        if self._client is None:
            self._client = LyceumClient.from_env()
        return self._client

    # -- VMs ---------------------------------------------------------------------------------
    def create_vm(self, spec: VMSpec) -> VMRecord:
        profile, market = check(spec), market_of(spec)
        body = {"hardware_profile": profile, "user_public_key": spec.ssh_public_key, "name": spec.name,
                "instance_specs": instance_specs(spec, profile, specs_shape()), "instance_type": market}
        try:
            # Checked again here: capacity can go between `glue up`'s check and this VM's turn.
            self._check_capacity(profile, spec.gpu_count, market)
            created = self.api.create_vm(body)
        except LyceumCapacity as exc:  # availability raced: nothing was created
            raise NoCapacity(refused(offers(self.api.availability_answer()), profile, spec.gpu_count, str(exc),
                                     market)) from None
        except NoCapacity as exc:  # kept a NoCapacity: `glue watch` waits it out
            raise NoCapacity(f"{exc}{self._still_billed()}") from None
        except GlueError as exc:
            raise GlueError(f"{exc}{self._still_billed()}") from exc
        vm_id = str(created.get("vm_id") or "")
        if not vm_id:
            raise GlueError(f"Lyceum accepted the create of {spec.name} but returned no vm_id{self._still_billed()}")
        # Recorded before the wait: an apply killed now must still know this VM is ours (owned_vm_ids).
        self._save_record(vm_id, {"name": spec.name, "host_key": "", "hardware_profile": profile,
                                  "gpu_count": spec.gpu_count, "market": market})
        try:
            status = self._wait_running(vm_id, spec.name, created)
            host, port = parse_address(str(status["ip_address"]))
            host_key = self._pin_host_key(host, port, spec.name)
            user = self._login_user(host, port, host_key, spec)
        except BaseException as exc:
            cleanup = self._abandon(vm_id)
            if isinstance(exc, GlueError):
                raise GlueError(f"{exc}; {cleanup}{self._still_billed(exclude=vm_id)}") from exc
            raise
        local = {"name": spec.name, "host_key": host_key, "ssh_user": user, "market": market}
        self._save_record(vm_id, {**local, "hardware_profile": profile, "gpu_count": spec.gpu_count})
        return self._record(vm_id, status, local)

    def _login_user(self, host: str, port: int, host_key: str, spec: VMSpec) -> str:
        """The user gpukit logs in as (see login.py): the one asked for, else detected."""
        wanted = str(getattr(spec, "ssh_user", "") or "")
        deadline = min(_env_float("LYCEUM_CREATE_TIMEOUT", 900.0), 180.0)
        try:
            return login.detect(host, port, host_key, ssh_client_key_path(self.home), wanted, deadline_s=deadline)
        except GlueError as exc:
            raise GlueError(f"Lyceum VM {spec.name}: {exc}") from None

    def _check_capacity(self, profile: str, gpu_count: int, market: str) -> None:
        problem = shortfall(offers(self.api.availability_answer()), profile, gpu_count, market)
        if problem:
            raise NoCapacity(problem)

    def _wait_running(self, vm_id: str, name: str, first: dict[str, Any]) -> dict[str, Any]:
        timeout = _env_float("LYCEUM_CREATE_TIMEOUT", 900.0)
        interval = _env_float("LYCEUM_POLL_INTERVAL", 5.0)
        deadline = time.monotonic() + timeout
        status = first
        with self._progress(f"lyceum: {name} ({vm_id}) pending") as (progress, task):
            while True:
                state = str(status.get("status", "")).lower()
                progress.update(task, description=f"lyceum: {name} ({vm_id}) {state or 'unknown'}")
                if state in RUNNING_STATUSES and status.get("ip_address"):
                    return status
                if state in GONE_STATUSES:
                    raise GlueError(f"Lyceum VM {name} ({vm_id}) became {state} while starting")
                if time.monotonic() >= deadline:
                    raise GlueError(f"Lyceum VM {name} ({vm_id}) is still {state or 'not running'} after "
                                    f"{timeout:g}s (LYCEUM_CREATE_TIMEOUT); Lyceum may be short of capacity")
                time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
                try:
                    status = self.api.vm_status(vm_id)
                except LyceumNotFound:
                    raise GlueError(f"Lyceum VM {name} ({vm_id}) disappeared while starting") from None

    @contextmanager
    def _progress(self, description: str) -> Iterator[tuple[Progress, TaskID]]:
        """One progress display shared by every VM this backend creates at the same time
        (terraform creates them in parallel threads; a console holds one live display)."""
        with self._progress_lock:
            if self._progress_users == 0:
                self._live = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=self.console, transient=True)
                self._live.start()
            self._progress_users += 1
            live = self._live
        assert live is not None
        task = live.add_task(description)
        try:
            yield live, task
        finally:
            live.remove_task(task)
            with self._progress_lock:
                self._progress_users -= 1
                if self._progress_users == 0:
                    live.stop()
                    self._live = None

    def _pin_host_key(self, host: str, port: int, name: str) -> str:
        """Trust on first use: the key the VM presents right after it reports running."""
        deadline = time.monotonic() + min(_env_float("LYCEUM_CREATE_TIMEOUT", 900.0), 300.0)
        last = ""
        while time.monotonic() < deadline:
            try:
                return scan_host_key(host, port)
            except (OSError, paramiko.SSHException, EOFError) as exc:
                last = str(exc) or type(exc).__name__
            time.sleep(1.0)
        raise GlueError(f"Lyceum VM {name} runs but its SSH server at {host}:{port} never answered ({last})")

    def _abandon(self, vm_id: str) -> str:
        """Delete a VM whose create failed; say what happened to it."""
        try:
            self.api.delete_vm(vm_id)
        except GlueError as exc:
            return (f"deleting VM {vm_id} ALSO failed ({exc}); it may still be billed: "
                    f"run `{DELETE_COMMAND} {vm_id}`")
        return f"VM {vm_id} was deleted again"

    def _still_billed(self, exclude: str = "") -> str:
        """A suffix naming the account's VMs that are still up, and the commands that delete them."""
        try:
            vms = [v for v in self.api.list_vms()
                   if str(v.get("status", "")).lower() not in GONE_STATUSES and v.get("vm_id") != exclude]
        except GlueError:
            return "; list the account's VMs with `python -m glue.cloud.lyceum list`"
        if not vms:
            return ""
        names = ", ".join(f"{v.get('name') or '?'} ({v.get('vm_id')}, {v.get('status')})" for v in vms)
        return (f"; still up and billed on this Lyceum account: {names}: `glue down` deletes this cluster's, "
                f"`{DELETE_COMMAND} <vm_id>` any one")

    def read_vm(self, vm_id: str) -> VMRecord | None:
        try:
            status = self.api.vm_status(vm_id)
        except LyceumNotFound:
            return None
        if str(status.get("status", "")).lower() in GONE_STATUSES:
            return None
        return self._record(vm_id, status, self._load_record(vm_id))

    def list_vms(self) -> list[dict[str, Any]]:
        return self.api.list_vms()

    def owned_vm_ids(self) -> list[str]:
        """VMs created from this kit home (a record is written as soon as the create answers)."""
        if not self.records.is_dir():
            return []
        return sorted(p.stem for p in self.records.glob("*.json") if self.read_vm(p.stem) is not None)

    def delete_vm(self, vm_id: str) -> None:
        self.api.delete_vm(vm_id)
        deadline = time.monotonic() + _env_float("LYCEUM_DELETE_TIMEOUT", 120.0)
        state = ""
        while time.monotonic() < deadline:
            try:
                state = str(self.api.vm_status(vm_id).get("status", "")).lower()
            except LyceumNotFound:
                break
            if state in GONE_STATUSES:
                break
            time.sleep(min(_env_float("LYCEUM_POLL_INTERVAL", 5.0), 2.0))
        else:
            raise GlueError(f"Lyceum VM {vm_id} is still {state} after deletion was requested; "
                            f"check with `python -m glue.cloud.lyceum list`")
        (self.records / f"{vm_id}.json").unlink(missing_ok=True)

    def _record(self, vm_id: str, status: dict[str, Any], local: dict[str, Any]) -> VMRecord:
        host, port = parse_address(str(status["ip_address"])) if status.get("ip_address") else ("", 0)
        profile = str(status.get("hardware_profile") or local.get("hardware_profile") or "cpu").lower()
        gpu_count = status.get("gpu_count")
        if gpu_count is None:
            gpu_count = (status.get("instance_specs") or {}).get("gpu_count", local.get("gpu_count", 0))
        return VMRecord(
            id=vm_id, name=str(local.get("name") or status.get("name") or vm_id), ssh_host=host, ssh_port=port,
            ssh_user=str(local.get("ssh_user") or SSH_USER), host_key=str(local.get("host_key", "")),
            gpu_type=PROFILES.get(profile, profile),
            gpu_count=int(gpu_count or 0), backend=NAME, status=str(status.get("status", "")).lower(),
            # The pool it was created in: a spot VM can be reclaimed (without a notice: only its status changes).
            market=str(status.get("instance_type") or local.get("market") or ON_DEMAND).lower(),
        )

    def _save_record(self, vm_id: str, data: dict[str, Any]) -> None:
        """Facts the API does not keep (the pinned host key). Not secret."""
        self.records.mkdir(parents=True, exist_ok=True)
        (self.records / f"{vm_id}.json").write_text(json.dumps(data))

    def _load_record(self, vm_id: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self.records / f"{vm_id}.json").read_text()))
        except (OSError, ValueError):
            return {}

    # -- bucket ------------------------------------------------------------------------------
    def _credentials(self, force: bool = False) -> lyceum_creds.StoredCredentials:
        return lyceum_creds.current(self.cred_file, self.api.storage_credentials, force=force)

    def bucket(self) -> BucketInfo:
        return self._credentials().bucket_info()

    def bucket_credentials(self) -> BucketCredentials:
        """Fresh credentials (refreshed, and the 0600 file rewritten, when near expiry)."""
        return self._credentials().bucket_credentials()

    def credentials_callback(self) -> Callable[[], BucketCredentials]:
        """For the checkpointer on the controller: refreshes through the API when needed."""
        return lyceum_creds.RefreshingCredentials(self.cred_file, refresh=self._credentials)


# -- `python -m glue.cloud.lyceum`: see and delete what runs (and bills) on the account ---------
def _main(argv: list[str]) -> int:
    usage = "usage: python -m glue.cloud.lyceum list | availability | pricing | delete <vm_id> [<vm_id> ...]"
    if not argv or argv[0] not in ("list", "availability", "pricing", "delete") or \
            (argv[0] == "delete") != (len(argv) > 1):
        print(usage, file=sys.stderr)
        return 2
    console = Console()
    try:
        client = LyceumClient.from_env()
        if argv[0] == "list":
            for vm in client.list_vms():
                console.print(f"{vm.get('vm_id')}  {vm.get('name') or '-'}  {vm.get('status')}  "
                              f"{vm.get('hardware_profile') or '-'}  {vm.get('ip_address') or '-'}  "
                              f"billed {vm.get('billed', '-')}", highlight=False)
        elif argv[0] == "pricing":
            kept = pricing.save(paths.home(), client.pricing())
            for (market, gpu), per_gpu in sorted(kept.items()):
                console.print(f"{market:9}  {gpu:5}  {per_gpu:.2f} per GPU-hour", highlight=False)
            console.print(f"{len(kept)} prices kept in {pricing.cache_path(paths.home())} (currency not stated)"
                          if kept else "GET /pricing listed no VM prices; the recorded table stays in use",
                          highlight=False)
        elif argv[0] == "availability":
            for v in client.availability():
                console.print("  ".join(f"{k}={v[k]}" for k in v), highlight=False)
        else:
            for vm_id in argv[1:]:
                client.delete_vm(vm_id)
                console.print(f"deleted {vm_id}", highlight=False)
    except GlueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""An emulator of Lyceum's VM and storage API, on loopback, backed by local VMs and a local bucket.

Routes (under /api/v2/external), with the documented request/response shapes:
  POST /vms/create          {hardware_profile, user_public_key, name?, instance_specs?, instance_type?
                            (on-demand | spot)} -> pending VM
  GET  /vms/{vm_id}/status  pending -> provisioning -> running (ip_address "127.0.0.1:<port>")
  GET  /vms/list            {"vms": [...], "total": n}; terminated VMs too unless ?include_terminated=false
  GET  /vms/availability    {"available_hardware_profiles": [...]} (the guide's shape), or
                            {"available_instance_variants": [...]} (the API reference's): availability_shape
  DELETE /vms/{vm_id}       terminate (the local VM and its disk are destroyed)
  POST /storage/credentials {access_key, secret_key, session_token, endpoint, bucket_name, region, expires_at}
  GET  /pricing             [{meter_slug, applies_to: {hardware_profile: "on-demand.h100.1x"}, unit,
                              unit_price_per_hour}] (the live API's rows)
  POST /execution/image/start, GET /execution/{id}, GET /logs/execution/{id}, POST /workloads/abort/{id}:
                            serverless runs as local processes (executions.py)
Errors carry FastAPI's `detail`: 401 (missing/unknown key), 403 (inactive key), 404 (unknown VM),
422 (malformed body, detail is a list of {loc, msg, type}), 400 (unknown profile), 500 "could not be
provisioned" (no capacity, as live; the docs' 409 with capacity_answer="docs").

Test controls (methods here, and unauthenticated POSTs under /_emulator/ for the CLI mode):
faults (5xx/429, a body that is not JSON, or a connection closed without an answer; optionally
after the request was processed), capacity per profile and pool (on-demand, spot: set_capacity),
VMs stuck in pending, killing a VM out of band (a host failure, a reclaimed spot VM: only its status
changes), expiring every storage credential. `connections` counts the TCP connections accepted (the
server speaks HTTP/1.1 keep-alive, so a client that reuses its connections opens few).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import paramiko

from glue.cloud.base import VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import free_port
from glue.errors import GlueError

from . import cloud_init
from .executions import Executions
from .sts_bucket import StsBucket

PREFIX = "/api/v2/external"
HOST = "127.0.0.1"
# The docs' cpu profile and the GPU profiles a live 400 lists (2026); capacity only for cpu, a100 and h100
# unless a test gives some (set_capacity).
PROFILES = ("cpu", "a100", "b200", "b300", "h100", "h200", "l40s")
PRICES = {"cpu": 0.35, "a100": 1.79, "b200": 6.59, "b300": 8.09, "h100": 2.89, "h200": 4.39,
          "l40s": 1.29}  # made up: the emulator bills nobody
SPEC_FIELDS = ("cpu", "memory", "disk", "gpu_count")
LEGACY_MIN_FIELDS = {"vcpu": "cpu", "memory": "memory", "disk": "disk"}  # {"min": n} in the older shape
LEGACY_FIELDS = (*LEGACY_MIN_FIELDS, "gpu_type", "gpu_count", "gpu_memory")
# What the profiles list (made up, like the prices): GPU model, vCPUs, memory, units in total.
HARDWARE = {"cpu": ("none", 8, 32, 64), "a100": ("a100", 16, 128, 16), "h100": ("h100", 26, 200, 16),
            **{g: (g, 32, 256, 8) for g in ("b200", "b300", "h200", "l40s")}}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Fault:
    """Answer the next `count` matching requests with `status` (the 5xx/429 a real API can give).

    `body`: send this text (as `content_type`) instead of a JSON `detail`, e.g. a proxy's HTML page.
    `drop`: close the connection without any answer (status is then ignored; recorded as 0).
    """

    status: int
    count: int = 1
    path: str = ""  # substring of the path below /api/v2/external
    method: str = ""
    retry_after: float | None = None
    after_processing: bool = False  # handle the request, then answer the fault (a lost response)
    detail: str = "emulated upstream failure"
    body: str | None = None
    content_type: str = "text/html"
    drop: bool = False


@dataclass
class VM:
    vm_id: str
    name: str | None
    profile: str
    gpu_count: int
    specs: dict[str, int]
    public_key: str
    created_at: float
    status: str = "pending"
    ip_address: str | None = None
    local_id: str | None = None
    running_since: float | None = None
    boot: threading.Thread | None = field(default=None, repr=False)
    instance_type: str = "on-demand"
    error: str = ""  # why it went to "error" while booting (for tests; not part of the API)

    def billed(self) -> float:
        if self.running_since is None:
            return 0.0
        hours = (time.time() - self.running_since) / 3600
        return round(hours * PRICES[self.profile] * max(1, self.gpu_count), 4)

    def status_doc(self) -> dict[str, Any]:
        return {
            "vm_id": self.vm_id, "status": self.status, "instance_specs": dict(self.specs),
            "created_at": _iso(self.created_at), "ip_address": self.ip_address,
            "uptime_seconds": int(time.time() - self.running_since) if self.running_since else None,
            "billed": self.billed(), "hardware_profile": self.profile, "gpu_count": self.gpu_count, "name": self.name,
            "instance_type": self.instance_type,
        }

    def list_doc(self) -> dict[str, Any]:
        return {"vm_id": self.vm_id, "name": self.name, "status": self.status, "ip_address": self.ip_address,
                "hardware_profile": self.profile, "gpu_count": self.gpu_count, "billed": self.billed(),
                "created_at": _iso(self.created_at), "instance_type": self.instance_type}


class Emulator:
    """`with Emulator(tmp_path) as emu:` then point LYCEUM_API_URL at emu.url, LYCEUM_API_KEY at emu.api_key."""

    def __init__(self, home: Path, api_keys: list[str] | None = None, pending_s: float = 0.3,
                 credentials_ttl: float = 900.0, boot_vms: bool = True, port: int = 0, bucket: str = "gpukit",
                 login_user: str = "root", live: bool = False) -> None:
        self.home = home
        self.api_keys = list(api_keys or [f"lk_emu_{secrets.token_hex(16)}"])
        self.inactive_keys: set[str] = set()
        self.pending_s = pending_s
        self.boot_vms = boot_vms
        # The image's user: "root" (the docs' `ssh root@<ip>`), or e.g. "ubuntu" with passwordless sudo
        # and root disabled the way cloud-init does it (see cloud_init.py).
        self.login_user = login_user
        self.port = port
        self.capacity: dict[str, list[int] | None] = {"cpu": [], "a100": [1, 2, 4, 8], "h100": [1, 2, 4, 8]}
        # The spot pool (instance_type "spot"), separate as live: a profile absent here has no spot variant.
        self.spot_capacity: dict[str, list[int] | None] = {}
        # "profiles": the guide's available_hardware_profiles; "variants": the reference's shape.
        self.availability_shape = "profiles"
        # None: accept both instance_specs shapes; "current" / "legacy": only that one (422 for the
        # other, as a strict server would).
        self.specs_shape: str | None = None
        self.stuck_pending = False
        # A create without capacity: "live" answers HTTP 500 "could not be provisioned" (as Lyceum does),
        # "docs" the documented 409.
        self.capacity_answer = "live"
        # live=True: VMs as the live API shows them: opaque ids (undashed hex, or a dashed UUID), a create
        # answer whose top-level hardware_profile/gpu_count are null (the values sit in instance_specs), and
        # status "ready" with no ip_address for `address_after_s` before the address appears.
        self.live = live
        self.address_after_s = 0.5 if live else 0.0
        self.ready_without_address = 0  # status answers that said "ready" with no address yet
        self.faults: list[Fault] = []
        self.vms: dict[str, VM] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status): never headers
        self.create_bodies: list[Any] = []  # every POST /vms/create body, as sent
        self.connections = 0  # TCP connections accepted
        self.local = LocalBackend(home / "local")
        self.sts = StsBucket(home / "bucket", bucket=bucket, ttl=credentials_ttl)
        # Serverless runs (POST /execution/image/start ...): processes here, the bucket at their /mnt/s3.
        self.executions = Executions(home / "runs", home / "bucket" / "data" / bucket, pending_s=pending_s)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_key(self) -> str:
        return self.api_keys[0]

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{HOST}:{self._server.server_address[1]}{PREFIX}"

    def env(self) -> dict[str, str]:
        """What the kit needs in its environment to talk to this emulator."""
        return {"LYCEUM_API_URL": self.url, "LYCEUM_API_KEY": self.api_key}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Emulator:
        self.home.mkdir(parents=True, exist_ok=True)
        self.sts.start()
        self._server = ThreadingHTTPServer((HOST, self.port), _Handler)
        self._server.daemon_threads = True
        self._server.emulator = self  # type: ignore[attr-defined]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="lyceum-emulator", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving; every VM still up is destroyed (nothing outlives the emulator)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for vm in list(self.vms.values()):
            if vm.boot is not None:
                vm.boot.join(60)
            self._destroy(vm, "terminated")
        self.executions.stop_all()
        self.sts.stop()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls -----------------------------------------------------------------------
    def inject(self, status: int, count: int = 1, **kw: Any) -> None:
        with self._lock:
            self.faults.append(Fault(status, count, **kw))

    def set_capacity(self, profile: str, gpu_counts: list[int] | None, market: str = "on-demand") -> None:
        """None: the profile is not offered at all (no capacity); [] on a GPU profile: offered, none free now."""
        with self._lock:
            (self.spot_capacity if market == "spot" else self.capacity)[profile] = gpu_counts

    def kill(self, vm_id: str, status: str = "terminated") -> None:
        """Lose a VM out of band (a host failure, a reclaimed spot VM)."""
        self._destroy(self.vms[vm_id], status)

    def live_vms(self) -> list[VM]:
        return [vm for vm in self.vms.values() if vm.status not in ("terminated", "error")]

    # -- VM lifecycle ------------------------------------------------------------------------
    def _destroy(self, vm: VM, status: str) -> None:
        with self._lock:
            vm.status = status
            vm.ip_address = None
            vm.running_since = None
            local_id, vm.local_id = vm.local_id, None
        if local_id:
            self.local.delete_vm(local_id)

    def _boot(self, vm: VM) -> None:
        deadline = time.monotonic() + self.pending_s
        while not self._stopping.is_set() and (time.monotonic() < deadline or self.stuck_pending):
            if vm.status != "pending":
                return
            time.sleep(0.05)
        with self._lock:
            if vm.status != "pending" or self._stopping.is_set():
                return
            vm.status = "provisioning"
        local_id = None
        try:
            if self.boot_vms:
                name = re.sub(r"[^a-z0-9-]", "-", (vm.name or "vm").lower()).strip("-")[:30] or "vm"
                keys = vm.public_key
                if self.login_user != "root":  # the first-boot script logs in with the emulator's key
                    keys += "\n" + cloud_init.emulator_key(self.home)[1]
                rec = self.local.create_vm(VMSpec(name=name, gpu_type="none", gpu_count=0, disk_gb=10,
                                                  ssh_public_key=keys))
                local_id, port = rec.id, rec.ssh_port
                if self.login_user != "root":
                    cloud_init.configure(rec, self.home, self.login_user, vm.public_key)
            else:
                port = free_port()
        except (GlueError, OSError, RuntimeError, paramiko.SSHException) as exc:
            if local_id:
                self.local.delete_vm(local_id)
            with self._lock:
                vm.status, vm.error = "error", str(exc)
            return
        if self.address_after_s:  # live: "ready" first, the address only later
            with self._lock:
                if vm.status == "provisioning":
                    vm.status = "ready"
            self._stopping.wait(self.address_after_s)
        with self._lock:
            if vm.status in ("provisioning", "ready") and not self._stopping.is_set():
                vm.status = "ready" if self.live else "running"
                vm.ip_address, vm.local_id = f"{HOST}:{port}", local_id
                vm.running_since = time.time()
                return
        if local_id:  # deleted (or the emulator stopped) while it booted
            self.local.delete_vm(local_id)

    def _refresh(self, vm: VM) -> VM:
        """A running VM whose local VM died is reported as error (the host lost it)."""
        if vm.status in ("running", "ready") and vm.local_id and self.local.read_vm(vm.local_id) is None:
            self._destroy(vm, "error")
        return vm

    # -- request handling --------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Any, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON document or raw bytes, extra headers); status 0: close without answering."""
        if path.startswith("/_emulator/"):
            return self._admin(method, path, raw)
        if not path.startswith(PREFIX + "/"):
            return 404, {"detail": "Not Found"}, {}
        route, _, query = path[len(PREFIX):].partition("?")
        auth = headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return 401, {"detail": "Not authenticated"}, {}
        key = auth[7:].strip()
        if key in self.inactive_keys:
            return 403, {"detail": "API key is inactive"}, {}
        if key not in self.api_keys:
            return 401, {"detail": "Invalid or expired API key"}, {}
        fault = self._take_fault(method, route)
        if fault is not None and not fault.after_processing:
            return self._fault_answer(fault)
        answer = self._route(method, route, raw, query)
        return self._fault_answer(fault) if fault is not None else answer

    def _take_fault(self, method: str, route: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.count > 0 and fault.path in route and fault.method in ("", method):
                    fault.count -= 1
                    return fault
        return None

    @staticmethod
    def _fault_answer(fault: Fault) -> tuple[int, Any, dict[str, str]]:
        if fault.drop:
            return 0, b"", {}
        extra = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
        if fault.body is not None:
            return fault.status, fault.body.encode(), {**extra, "Content-Type": fault.content_type}
        return fault.status, {"detail": fault.detail}, extra

    def _route(self, method: str, route: str, raw: bytes,
               query: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
        ran = self.executions.route(method, route, raw, query)
        if ran is not None:
            return ran
        if method == "POST" and route == "/vms/create":
            return self._create(raw)
        if method == "GET" and route == "/vms/list":  # as live: terminated VMs too, unless include_terminated=false
            with self._lock:
                docs = [self._refresh(vm).list_doc() for vm in self.vms.values()]
            if "include_terminated=false" in query.split("&"):
                docs = [d for d in docs if d.get("status") != "terminated"]
            return 200, {"vms": docs, "total": len(docs)}, {}
        if method == "GET" and route == "/vms/availability":
            if self.availability_shape == "variants":
                return 200, {"available_instance_variants": self._variants()}, {}
            return 200, {"available_hardware_profiles": self._profiles()}, {}
        if method == "POST" and route == "/storage/credentials":
            return 200, self.sts.issue(), {}
        if method == "GET" and route == "/pricing":
            return 200, self._pricing(), {}  # type: ignore[return-value]  # a list, as the live API answers
        match = re.fullmatch(r"/vms/([^/]+)(/status)?", route)
        if match and (method, bool(match.group(2))) in (("GET", True), ("DELETE", False)):
            vm = self.vms.get(match.group(1))
            if vm is None:
                return 404, {"detail": f"VM {match.group(1)} not found"}, {}
            if method == "GET":
                doc = self._refresh(vm).status_doc()
                self.ready_without_address += doc["status"] == "ready" and doc["ip_address"] is None
                return 200, doc, {}
            self._destroy(vm, "terminated")
            return 200, {"vm_id": vm.vm_id, "status": "terminated", "message": "VM terminated"}, {}
        return 404, {"detail": "Not Found"}, {}

    @staticmethod
    def _pricing() -> list[dict[str, Any]]:
        """GET /pricing rows as the live API shapes them: a VM profile's whole price per hour, as a string;
        spot at half (made up, like PRICES)."""
        return [{"meter_slug": "vm_running", "unit": "second",
                 "applies_to": {"hardware_profile": f"{market}.{p}.{n}x"},
                 "unit_price_per_hour": f"{PRICES[p] * n * (0.5 if market == 'spot' else 1):.2f}"}
                for p in PROFILES for market in ("on-demand", "spot") for n in (1, 8)] + [
                {"meter_slug": "storage", "unit": "gb_month", "applies_to": {}, "unit_price_per_hour": "0.01"}]

    def _variants(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"hardware_profile": p, "instance_type": market, "price_per_hour": PRICES[p] * (
                        0.5 if market == "spot" else 1), "allowed_gpus_per_instance": [1, 2, 4, 8],
                     "available_gpus_per_instance": list(counts), "block_storage_gpu_counts": []}
                    for market, pool in (("on-demand", self.capacity), ("spot", self.spot_capacity))
                    for p, counts in pool.items() if counts is not None]

    def _profiles(self) -> list[dict[str, Any]]:
        with self._lock:
            out = []
            for p, counts in self.capacity.items():
                gpu, vcpu, memory_gb, total = HARDWARE[p]
                free = 0 if counts is None else max(counts or [total])
                out.append({"hardware_profile": p, "available": free, "total": total, "gpu_type": gpu,
                            "vcpu": vcpu, "memory_gb": memory_gb})
            return out

    def _create(self, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return 422, {"detail": [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error"}]}, {}
        self.create_bodies.append(body)
        errors = _validate_create(body, self.specs_shape)
        if errors:
            return 422, {"detail": errors}, {}
        profile = body["hardware_profile"]
        if profile not in PROFILES:
            return 400, {"detail": f"Invalid hardware profile '{profile}'. Valid profiles: {', '.join(PROFILES)}"}, {}
        specs = _normalized_specs(body.get("instance_specs") or {})
        gpu_count = specs.get("gpu_count", 0 if profile == "cpu" else 1)
        market = body.get("instance_type") or "on-demand"  # the server's default when a client sends none
        if market not in ("on-demand", "spot"):
            return 400, {"detail": f"Invalid instance_type '{market}'. Valid instance types: on-demand, spot"}, {}
        with self._lock:
            counts = (self.spot_capacity if market == "spot" else self.capacity).get(profile)
            if counts is None or (profile != "cpu" and gpu_count not in counts):
                if self.capacity_answer == "docs":
                    return 409, {"detail": f"No capacity available for {profile} with {gpu_count} GPU(s)"}, {}
                return 500, {"detail": f"VM could not be provisioned: no {profile} capacity"}, {}
            vm_id = (secrets.token_hex(16) if len(self.vms) % 2 else str(uuid.uuid4())) if self.live else \
                f"vm-{secrets.token_hex(6)}"
            vm = VM(vm_id=vm_id, name=body.get("name"), profile=profile, gpu_count=gpu_count,
                    specs={"disk": 100, **specs}, public_key=body["user_public_key"], created_at=time.time(),
                    instance_type=market)
            self.vms[vm.vm_id] = vm
            vm.boot = threading.Thread(target=self._boot, args=(vm,), name=f"boot-{vm.vm_id}", daemon=True)
            vm.boot.start()
        doc = vm.status_doc()
        if self.live:
            doc.update(hardware_profile=None, gpu_count=None)
        doc.update({"status_check_url": f"{PREFIX}/vms/{vm.vm_id}/status",
                    "polling_message": "The VM is being provisioned; poll the status URL until it is running."})
        return 200, doc, {}

    def _admin(self, method: str, path: str, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        data = json.loads(raw or b"{}")
        kill = re.fullmatch(r"/_emulator/vms/([^/]+)/kill", path)
        if method == "GET" and path == "/_emulator/state":
            return 200, {"vms": [vm.list_doc() for vm in self.vms.values()], "requests": self.requests}, {}
        if method == "POST" and kill and kill.group(1) in self.vms:
            self.kill(kill.group(1), data.get("status", "terminated"))
            return 200, {}, {}
        if method == "POST" and path == "/_emulator/faults":
            self.inject(**data)
            return 200, {}, {}
        if method == "POST" and path == "/_emulator/capacity":  # {profile: counts}, spot under "spot"
            for profile, counts in data.pop("spot", {}).items():
                self.set_capacity(profile, counts, "spot")
            for profile, counts in data.items():
                self.set_capacity(profile, counts)
            return 200, {}, {}
        if method == "POST" and path == "/_emulator/shapes":
            self.availability_shape = data.get("availability", self.availability_shape)
            self.specs_shape = data.get("instance_specs", self.specs_shape)
            return 200, {}, {}
        if method == "POST" and path == "/_emulator/stuck":
            self.stuck_pending = bool(data.get("stuck", True))
            return 200, {}, {}
        if method == "POST" and path == "/_emulator/storage/expire":
            self.sts.expire_all()
            return 200, {}, {}
        return 404, {"detail": "Not Found"}, {}


def _shape_of(specs: dict[str, Any]) -> str:
    return "legacy" if any(isinstance(v, dict) for v in specs.values()) or "vcpu" in specs else "current"


def _normalized_specs(specs: dict[str, Any]) -> dict[str, int]:
    """Either shape as {cpu, memory, disk, gpu_count} (how the status answer reports them)."""
    if _shape_of(specs) == "legacy":
        out = {LEGACY_MIN_FIELDS[k]: int(v["min"]) for k, v in specs.items() if k in LEGACY_MIN_FIELDS}
        return {**out, **({"gpu_count": int(specs["gpu_count"])} if "gpu_count" in specs else {})}
    return {k: int(v) for k, v in specs.items() if k in SPEC_FIELDS}


def _validate_create(body: Any, specs_shape: str | None = None) -> list[dict[str, Any]]:
    """FastAPI/pydantic-style validation errors for the create body; `specs_shape` makes the server
    strict about which instance_specs shape it takes."""
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ["body"], "msg": "Input should be a valid dictionary"}]
    errors: list[dict[str, Any]] = []
    for name in ("user_public_key", "hardware_profile"):
        if name not in body:
            errors.append({"type": "missing", "loc": ["body", name], "msg": "Field required"})
        elif not isinstance(body[name], str):
            errors.append({"type": "string_type", "loc": ["body", name], "msg": "Input should be a valid string"})
    if body.get("name") is not None and not isinstance(body["name"], str):
        errors.append({"type": "string_type", "loc": ["body", "name"], "msg": "Input should be a valid string"})
    specs = body.get("instance_specs")
    if specs is None:
        return errors
    if not isinstance(specs, dict):
        return [*errors, {"type": "dict_type", "loc": ["body", "instance_specs"],
                          "msg": "Input should be a valid dictionary"}]
    shape = _shape_of(specs)
    if specs_shape is not None and shape != specs_shape:
        allowed = SPEC_FIELDS if specs_shape == "current" else LEGACY_FIELDS
        return [*errors, *({"type": "extra_forbidden", "loc": ["body", "instance_specs", key],
                            "msg": f"Extra inputs are not permitted (expected: {', '.join(allowed)})"}
                           for key in specs if key not in allowed or isinstance(specs[key], dict) != (
                               specs_shape == "legacy" and key in LEGACY_MIN_FIELDS))]
    for key, value in specs.items():
        if shape == "legacy" and key in LEGACY_MIN_FIELDS:
            value = value.get("min") if isinstance(value, dict) else None
        elif shape == "legacy" and key == "gpu_type":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            errors.append({"type": "int_type", "loc": ["body", "instance_specs", key],
                           "msg": "Input should be a valid non-negative integer"})
    return errors


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lyceum-emulator"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        emu: Emulator = self.server.emulator  # type: ignore[attr-defined]
        with emu._lock:
            emu.connections += 1

    def _serve(self) -> None:
        emu: Emulator = self.server.emulator  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, doc, extra = emu.handle(self.command, self.path, self.headers, raw)
        emu.requests.append((self.command, self.path.split("?", 1)[0], status))
        if status == 0:  # the answer is lost: the connection closes without one
            self.close_connection = True
            return
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        extra = dict(extra)
        self.send_response(status)
        self.send_header("Content-Type", extra.pop("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PUT = _serve

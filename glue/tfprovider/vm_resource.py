"""resource "gpukit_vm": one VM on the configured backend.

`read` answers None for a VM that is gone (terminated, killed, disk missing): Terraform then drops
it from state and plans a fresh one, so recovering onto a new VM is just the next apply.
"""

from __future__ import annotations

import re
from typing import Any

from tf import schema, types
from tf.iface import Config, CreateContext, DeleteContext, ReadContext, State, UpdateContext, UpgradeContext
from tf.provider import Resource
from tf.types import Unknown
from tf.utils import Diagnostics

from glue.cloud.base import VMRecord, VMSpec, relabel
from glue.cloud.lyceum.spec import PROFILES, input_errors, with_instance_specs
from glue.errors import GlueError
from glue.tfprovider.configured import ConfiguredProvider

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")
COMPUTED = ("id", "ssh_host", "ssh_port", "ssh_user", "host_key", "status", "backend", "market")
FOUND = ("gpu_type", "gpu_count")  # the configuration's when set, else the backend's record


def _known(value: Any) -> bool:
    return value is not None and value is not Unknown


class VMResource(Resource):
    def __init__(self, provider: ConfiguredProvider) -> None:
        self._provider = provider

    @classmethod
    def get_name(cls) -> str:
        return "vm"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        def inp(name: str, typ: Any, desc: str, **kw: Any) -> schema.Attribute:
            return schema.Attribute(name, typ, description=desc, requires_replace=True, **kw)

        def out(name: str, typ: Any, desc: str) -> schema.Attribute:
            return schema.Attribute(name, typ, description=desc, computed=True)

        return schema.Schema(
            # 2: optional hardware_profile, cpu, memory_gb; 3: ssh_user settable; 4: market; 5: config_seed;
            # 6: gpu_type and gpu_count optional, found by the backend when unset
            version=6,
            attributes=[
                # Renamed in place: a warm spare that takes a lost VM's place takes its name (glue moves
                # the spare's state to that address; the name is a label, the VM stays what it is).
                schema.Attribute("name", types.String(), description="VM name (lowercase letters, digits, dashes).",
                                 required=True),
                # Unset (null): as the backend finds the machine (the ssh backend's host checks), recorded.
                inp("gpu_type", types.String(), "GPU model, or \"none\" (default: as the backend finds it).",
                    optional=True, computed=True),
                inp("gpu_count", types.Number(), "GPUs on the VM (default: as the backend finds them).",
                    optional=True, computed=True),
                inp("disk_gb", types.Number(), "Ephemeral disk size (wiped at termination).",
                    optional=True, computed=True, default=100),
                inp("ssh_public_key", types.String(), "Public key authorised for root.", required=True),
                inp("hardware_profile", types.String(),
                    f"Lyceum hardware profile: {', '.join(PROFILES)} (default: from gpu_type).", optional=True),
                inp("cpu", types.Number(), "vCPUs (Lyceum; default: the profile's).", optional=True),
                inp("memory_gb", types.Number(), "Memory in GB (Lyceum; default: the profile's).", optional=True),
                # Set: log in as this user only. Unset: the backend finds the user the VM accepts (root
                # first, then the image's default) and records it; a prior value is kept, so no diff.
                inp("ssh_user", types.String(), "SSH user (default: detected; root on the local backend).",
                    optional=True, computed=True),
                # Unset: the backend's pool, recorded (on-demand on Lyceum; "" where there is no choice).
                inp("market", types.String(), "Capacity pool: on-demand or spot (Lyceum; reclaimable, cheaper).",
                    optional=True, computed=True),
                # A path, never the contents: the file holds credentials and stays out of terraform's state.
                # Changing it changes no VM (each applies it once, at its first boot).
                schema.Attribute("config_seed", types.String(), optional=True,
                                 description="The cluster's configuration seed the VM applies at first boot "
                                             "(a root-only file in the kit home; backends that take one)."),
                out("id", types.String(), "Backend VM id."),
                out("ssh_host", types.String(), "SSH address."),
                out("ssh_port", types.Number(), "SSH port."),
                out("host_key", types.String(), "The VM's SSH host public key (pinned by glue)."),
                out("status", types.String(), "Backend status."),
                out("backend", types.String(), "Backend that owns the VM."),
            ],
        )

    def validate(self, diags: Diagnostics, type_name: str, config: Config) -> None:
        super().validate(diags, type_name, config)
        name = config.get("name")
        if isinstance(name, str) and not NAME_RE.match(name):
            diags.add_error(f"invalid VM name {name!r}", "Use 2-40 lowercase letters, digits and dashes.",
                            path=["name"])
        for key, lo, hi in (("gpu_count", 0, 16), ("disk_gb", 1, 65536)):
            val = config.get(key)
            if isinstance(val, int | float) and not lo <= val <= hi:
                diags.add_error(f"{key} = {val} is out of range", f"Use {lo}..{hi}.", path=[key])
        for key, what, fix in input_errors(config.get("hardware_profile"), config.get("gpu_count"),
                                           cpu=config.get("cpu"), memory_gb=config.get("memory_gb"),
                                           market=config.get("market")):
            diags.add_error(what, fix, path=[key])

    def upgrade(self, ctx: UpgradeContext, version: int, old: State) -> State | None:
        # Version 1 states lack the optional Lyceum inputs: they are null (unset), so no diff. Version 2
        # states hold ssh_user as computed: the same value, now also settable. Version 3 states lack the
        # market: null until the next read fills it from the backend. Version 4 states lack config_seed: null.
        # Version 5 states hold gpu_type and gpu_count as set: the same values.
        return {**{a.name: None for a in self.get_schema().attributes}, **old}

    @staticmethod
    def _state(planned: State, rec: VMRecord) -> State:
        new = dict(planned)
        new.update({k: getattr(rec, k) for k in COMPUTED})
        new.update({k: getattr(rec, k) for k in FOUND if not _known(planned.get(k))})
        return new

    def create(self, ctx: CreateContext, planned: State) -> State | None:
        spec = VMSpec(
            name=str(planned["name"]),
            gpu_type=str(planned["gpu_type"]) if _known(planned.get("gpu_type")) else "none",
            gpu_count=int(planned["gpu_count"]) if _known(planned.get("gpu_count")) else 0,
            disk_gb=int(planned.get("disk_gb") or 100),
            ssh_public_key=str(planned["ssh_public_key"]),
            config_seed=str(planned["config_seed"]) if planned.get("config_seed") else None,
        )
        spec = with_instance_specs(spec, planned.get("hardware_profile"), planned.get("cpu"), planned.get("memory_gb"),
                                   planned.get("ssh_user"), planned.get("market"))
        try:
            rec = self._provider.backend.create_vm(spec)
        except GlueError as exc:
            ctx.diagnostics.add_error(f"creating VM {spec.name}: {exc}")
            return None
        return self._state(planned, rec)

    def read(self, ctx: ReadContext, current: State) -> State | None:
        try:
            rec = self._provider.backend.read_vm(str(current["id"]))
        except GlueError as exc:
            ctx.diagnostics.add_error(f"reading VM {current.get('name')}: {exc}")
            return current
        return None if rec is None else self._state(current, rec)

    def update(self, ctx: UpdateContext, current: State, planned: State) -> State | None:
        # Every input but the name requires replacement: an in-place update is a rename (a warm spare taking
        # a lost VM's place; a label only, which a backend that records names is told) or carries computed values.
        if planned.get("name") != current.get("name"):
            relabel(self._provider.backend, str(current["id"]), str(planned["name"]))
        return self._state(planned, self._provider.backend.read_vm(str(current["id"])) or _missing(current))

    def delete(self, ctx: DeleteContext, current: State) -> None:
        try:
            self._provider.backend.delete_vm(str(current["id"]))
        except GlueError as exc:
            ctx.diagnostics.add_error(f"deleting VM {current.get('name')}: {exc}")


def _missing(current: State) -> VMRecord:
    raise GlueError(f"VM {current.get('name')} vanished during update; run `glue up` again")

"""The ssh backend's hosts file: machines the user already has, reached over SSH.

```yaml
hosts:
  - name: box-a            # optional: defaults to address (or address-port)
    address: 10.0.0.5
    port: 22               # default 22
    user: ubuntu           # root, or a user with passwordless sudo
    identity_file: ~/.ssh/id_ed25519
    proxy_jump: admin@bastion.example:22   # optional: reached through this machine (`ssh -J`); its user
                           # defaults to this host's, the identity file is this host's
    labels: {gpu_type: h100, gpu_count: 8}   # optional: found on the host when not given
```

Every bad entry is one line naming the host and the field; the file is never rewritten by gpukit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from glue import yamlfile
from glue.cloud import jumps
from glue.cloud.jumps import Jump
from glue.errors import GlueError, yaml_problem

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class Labels(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_type: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    gpu_count: int | None = Field(default=None, ge=0, le=16)


class HostEntry(BaseModel):
    """One machine of the file."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    address: str = Field(min_length=1, pattern=r"^[A-Za-z0-9.:_-]+$")
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    identity_file: str = Field(min_length=1)
    proxy_jump: str | None = None
    labels: Labels = Field(default_factory=Labels)

    @field_validator("proxy_jump")
    @classmethod
    def _jump(cls, value: str | None) -> str | None:
        if value is not None:
            jumps.parse(value, "root")  # the form only; the user defaults to the host's when the jump is made
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not NAME_RE.match(value):
            raise ValueError("use letters, digits, dots, dashes and underscores (at most 63)")
        return value

    @property
    def id(self) -> str:
        """The host's id in terraform's state (the gpukit_vm's id) and in the backend's records."""
        return self.name or (self.address if self.port == 22 else f"{self.address}-{self.port}")

    @property
    def where(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    def identity_path(self) -> Path:
        return Path(self.identity_file).expanduser()

    @property
    def jump_id(self) -> str | None:
        """The jump's name among the pins ("jump user@address:port"); None without one."""
        jump = self.jump()
        return f"jump {jump.where}" if jump else None

    def jump(self, host_key: str = "") -> Jump | None:
        """The jump this host is reached through, with the identity file of the host's entry."""
        if not self.proxy_jump:
            return None
        user, address, port = jumps.parse(self.proxy_jump, self.user)
        return Jump(user, address, port, self.identity_file, host_key)


class HostsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[HostEntry] = Field(min_length=1)


def _field_line(err: dict[str, Any], raw: Any) -> str:
    loc = list(err.get("loc") or [])
    if len(loc) >= 2 and loc[0] == "hosts" and isinstance(loc[1], int):
        entry = raw["hosts"][loc[1]] if isinstance(raw, dict) and isinstance(raw.get("hosts"), list) else {}
        label = entry.get("name") or entry.get("address") if isinstance(entry, dict) else None
        field = ".".join(str(p) for p in loc[2:]) or "entry"
        who = f"host {loc[1] + 1}" + (f" ({label})" if label else "")
        return f"{who}: {field}: {err.get('msg', 'invalid')}"
    return f"{'.'.join(str(p) for p in loc) or 'file'}: {err.get('msg', 'invalid')}"


def parse(text: str, source: str) -> list[HostEntry]:
    """The hosts of a hosts file's text; one GlueError line per bad entry (all of them, joined by '; ')."""
    try:
        raw = yamlfile.load(text)
    except yaml.YAMLError as exc:
        raise GlueError(f"hosts file {source}: not valid YAML{yaml_problem(exc)}") from None
    try:
        hosts = HostsFile.model_validate(raw).hosts
    except ValidationError as exc:
        lines = [_field_line(dict(e), raw) for e in exc.errors()]
        raise GlueError(f"hosts file {source}: " + "; ".join(lines) +
                        " (each host: address, user, identity_file; optional name, port, proxy_jump, labels)") from None
    seen: dict[str, int] = {}
    for i, h in enumerate(hosts, 1):
        if h.id in seen:
            raise GlueError(f"hosts file {source}: host {i} has the same name as host {seen[h.id]} ({h.id!r}); "
                            "give each a `name:` of its own")
        seen[h.id] = i
    return hosts


def load(path: Path) -> list[HostEntry]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise GlueError(f"hosts file {path}: cannot be read ({exc.strerror or exc}); pass an existing YAML file "
                        "with --hosts") from None
    return parse(text, str(path))


# -- the snapshot the provider reads (written by `glue up`, after the host checks) ------------------------
def snapshot_path(home: Path) -> Path:
    return home / "ssh-hosts" / "hosts.json"


def write_snapshot(home: Path, hosts: list[HostEntry]) -> None:
    path = snapshot_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([h.model_dump() for h in hosts], indent=1))
    tmp.replace(path)


def read_snapshot(home: Path) -> list[HostEntry]:
    """The hosts `glue up` last checked; [] before the first."""
    try:
        raw = json.loads(snapshot_path(home).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise GlueError(f"{snapshot_path(home)} cannot be read ({exc}); run `glue up --hosts FILE` again") from None
    return [HostEntry.model_validate(h) for h in raw]

"""Jump hosts (bastions): machines reached through another machine's SSH, as `ssh -J` does, where the ssh
backend's hosts file gives a host a `proxy_jump`.

One record per kit home, <home>/ssh/jumps.json: VM id -> the jump (user, address, port, identity file, its
pinned host key), written by `glue up` after the host checks; read by every SSH connection glue makes
(glue.infra.ssh) and by the inventory (Ansible's ProxyCommand). The jump is the user's machine, not gpukit's:
the kit's key is never put there, the login uses the user's own identity file (its path only, never its
contents), and its host key is pinned like any host's.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

import paramiko

from glue.errors import GlueError

SPEC_RE = re.compile(r"^(?:(?P<user>[a-z_][a-z0-9_-]{0,31})@)?(?P<address>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\])"
                     r"(?::(?P<port>[0-9]{1,5}))?$")


@dataclass(frozen=True)
class Jump:
    user: str
    address: str
    port: int
    identity_file: str
    host_key: str = ""  # "ssh-ed25519 AAAA...", pinned at first contact

    @property
    def where(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def parse(spec: str, default_user: str) -> tuple[str, str, int]:
    """(user, address, port) of `[user@]host[:port]`; ValueError saying the form when it is not one."""
    found = SPEC_RE.match(spec.strip())
    port = int(found.group("port") or 22) if found else 0
    if found is None or not 1 <= port <= 65535:
        raise ValueError("use [user@]host[:port], as `ssh -J` takes it (one jump)")
    return found.group("user") or default_user, found.group("address").strip("[]"), port


# -- the record -------------------------------------------------------------------------------------------
def path(home: Path) -> Path:
    return home / "ssh" / "jumps.json"


def read(home: Path) -> dict[str, Jump]:
    """VM id -> its jump; {} when no VM has one."""
    try:
        raw = json.loads(path(home).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise GlueError(f"{path(home)} cannot be read ({exc}); run `glue up` again to rewrite it") from None
    return {vm_id: Jump(**j) for vm_id, j in raw.items()}


def write(home: Path, jumps: dict[str, Jump]) -> None:
    target = path(home)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: asdict(v) for k, v in sorted(jumps.items())}, indent=1))
    tmp.replace(target)


# -- connections ------------------------------------------------------------------------------------------
class JumpedClient(paramiko.SSHClient):
    """A client whose transport runs through a jump's channel: closing it closes the jump's login too."""

    jump: paramiko.SSHClient | None = None

    def close(self) -> None:
        super().close()
        if self.jump is not None:
            self.jump.close()


def _pinned_policy(jump: Jump) -> paramiko.MissingHostKeyPolicy:
    class Pinned(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            if [key.get_name(), key.get_base64()] != jump.host_key.split()[:2]:
                raise GlueError(f"jump host {jump.where}: its host key CHANGED since it was pinned; refusing. "
                                "If the machine was reinstalled on purpose, remove its pin (\"jump "
                                f"{jump.where}\" under \"pins\" in <kit home>/ssh-hosts/state.json) and run "
                                "`glue up` again; otherwise treat this as an attack")

    return Pinned()


def reason(exc: BaseException) -> str:
    """A connection error in a few words (its strerror, else its text, else its type)."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def login(jump: Jump, timeout: float) -> paramiko.SSHClient:
    """Logged in on the jump with the user's identity; only its pinned key is accepted."""
    identity = Path(jump.identity_file).expanduser()
    if not identity.is_file():
        raise GlueError(f"jump host {jump.where}: identity_file {identity} does not exist; fix the path in the "
                        "hosts file")
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_pinned_policy(jump))
    try:
        client.connect(jump.address, port=jump.port, username=jump.user, key_filename=str(identity),
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, allow_agent=False,
                       look_for_keys=False)
    except GlueError:
        client.close()
        raise
    except paramiko.AuthenticationException:
        client.close()
        raise GlueError(f"jump host {jump.where} refused the key {identity}; add its public key to "
                        f"~{jump.user}/.ssh/authorized_keys there, or fix proxy_jump's user") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        raise GlueError(f"jump host {jump.where}: unreachable ({reason(exc)}); check proxy_jump's address and "
                        "port") from None
    return client


def channel(client: paramiko.SSHClient, jump: Jump, address: str, port: int, timeout: float) -> paramiko.Channel:
    """A TCP stream to address:port opened by the jump (direct-tcpip), to run SSH over."""
    transport = client.get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("no transport")
        return transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        raise GlueError(f"jump host {jump.where} cannot open a connection to {address}:{port} ({reason(exc)}); "
                        "check that the host is reachable from the jump and that its sshd allows TCP "
                        "forwarding") from None


def proxy_command(jump: Jump, known_hosts: Path) -> str:
    """OpenSSH's ProxyCommand for Ansible: the same jump, the same pinned known_hosts, the user's identity."""
    return " ".join(shlex.quote(a) for a in [
        "ssh", "-i", str(Path(jump.identity_file).expanduser()), "-p", str(jump.port), "-l", jump.user,
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-W", "%h:%p", jump.address])

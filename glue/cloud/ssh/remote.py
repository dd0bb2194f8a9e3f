"""SSH to a host of the file as its owner set it up: the file's user and identity file, the host key
pinned at first contact (a changed key is refused, an unpinned one never trusted here)."""

from __future__ import annotations

import base64
import hashlib
import shlex
import socket

import paramiko

from glue.cloud import jumps
from glue.cloud.jumps import Jump
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError

TIMEOUT = 8.0


def fingerprint(key_line: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line ("ssh-ed25519 AAAA...")."""
    blob = base64.b64decode(key_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _unreachable(host: HostEntry, exc: BaseException) -> GlueError:
    why = jumps.reason(exc)
    return GlueError(f"{host.id}: unreachable at {host.address}:{host.port} ({why}); check the address and port, "
                     "that sshd runs and that nothing blocks the way")


def _stream(host: HostEntry, via: Jump | None, timeout: float) -> tuple[socket.socket | paramiko.Channel,
                                                                        paramiko.SSHClient | None]:
    """A connection to the host's sshd: direct, or through its jump (then the jump's login with it)."""
    if via is None:
        try:
            return socket.create_connection((host.address, host.port), timeout=timeout), None
        except OSError as exc:
            raise _unreachable(host, exc) from None
    client = jumps.login(via, timeout)
    return jumps.channel(client, via, host.address, host.port, timeout), client


def server_key(host: HostEntry, timeout: float = TIMEOUT, via: Jump | None = None) -> str:
    """The key the host presents now (no login), through its jump when it has one (`via`, pinned)."""
    sock, jump_login = _stream(host, via, timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise _unreachable(host, exc) from None
    finally:
        transport.close()
        if jump_login is not None:
            jump_login.close()


class _Pinned(paramiko.MissingHostKeyPolicy):
    def __init__(self, pinned: str) -> None:
        self.pinned = pinned.split()[:2]

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        got = [key.get_name(), key.get_base64()]
        if got != self.pinned:
            raise paramiko.BadHostKeyException(hostname, key, key)


class HostKeyChanged(GlueError):
    """The host presents another key than the one pinned: refused, whatever else holds."""


def changed_key(host: HostEntry, pinned: str, now: str) -> HostKeyChanged:
    return HostKeyChanged(f"{host.id}: the host key at {host.address}:{host.port} CHANGED since it was pinned "
                     f"({fingerprint(pinned)}, now {fingerprint(now)}); refusing. If the machine was reinstalled on "
                     f"purpose, remove its entry under \"pins\" in <kit home>/ssh-hosts/state.json and run `glue up` "
                     "again to pin the new key; otherwise treat this as an attack")


def connect(host: HostEntry, pinned: str, timeout: float = TIMEOUT, via: Jump | None = None) -> paramiko.SSHClient:
    """Logged in as the file's user with the file's identity, through its jump when it has one (`via`);
    only the pinned host key is accepted."""
    identity = host.identity_path()
    if not identity.is_file():
        raise GlueError(f"{host.id}: identity_file {identity} does not exist; fix the path in the hosts file")
    sock, jump_login = _stream(host, via, timeout) if via is not None else (None, None)
    client = jumps.JumpedClient()
    client.jump = jump_login
    client.set_missing_host_key_policy(_Pinned(pinned))
    try:
        client.connect(host.address, port=host.port, username=host.user, key_filename=str(identity),
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, allow_agent=False,
                       look_for_keys=False, sock=sock)
    except paramiko.BadHostKeyException:
        client.close()
        raise changed_key(host, pinned, server_key(host, via=via)) from None
    except paramiko.AuthenticationException:
        client.close()
        raise GlueError(f"{host.id}: {host.user}@{host.address}:{host.port} refused the key {identity}; add its "
                        f"public key to ~{host.user}/.ssh/authorized_keys there, or fix user/identity_file") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        raise _unreachable(host, exc) from None
    return client


def run(client: paramiko.SSHClient, host: HostEntry, command: str, timeout: float = 60) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `command` in sh on the host."""
    try:
        _, out, err = client.exec_command(f"sh -c {shlex.quote(command)}", timeout=timeout)
        text, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return out.channel.recv_exit_status(), text, errors
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise _unreachable(host, exc) from None


def as_root(host: HostEntry, command: str) -> str:
    """`command` as root: directly for root, else through passwordless sudo (-n: fails at once)."""
    return command if host.user == "root" else f"sudo -n -H -- sh -c {shlex.quote(command)}"


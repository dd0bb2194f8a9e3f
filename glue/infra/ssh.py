"""SSH to a VM with paramiko: our key, the pinned known_hosts, unknown or changed keys refused."""

from __future__ import annotations

import secrets
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import paramiko

from glue.cloud import jumps
from glue.errors import GlueError
from glue.infra.inventory import Host, known_hosts_path
from glue.infra.ssh_keys import client_key


@dataclass
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


# A handshake garbled mid-way ("Invalid packet blocking", seen once in CI) or cut off (an EOFError from paramiko:
# sshd drops connections beyond MaxStartups; seen in CI as a deploy ending "Aborted!") is tried again.
HANDSHAKE_TRIES = 3


def connect(home: Path, host: Host, timeout: float = 5.0) -> paramiko.SSHClient:
    for attempt in range(1, HANDSHAKE_TRIES + 1):
        try:
            return _connect_once(home, host, timeout)
        except _Handshake as exc:
            if attempt == HANDSHAKE_TRIES:
                raise GlueError(f"{host.name}: SSH failed: {exc}") from exc.__cause__
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


class _Handshake(Exception):
    """A failed SSH handshake that is not about the host key: worth another try."""


def _connect_once(home: Path, host: Host, timeout: float) -> paramiko.SSHClient:
    client = jumps.JumpedClient()
    client.load_host_keys(str(known_hosts_path(home)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    jump = jumps.read(home).get(host.id)  # a host the user reaches through a bastion: so does glue
    sock = None
    if jump is not None:
        client.jump = jumps.login(jump, timeout)
        sock = jumps.channel(client.jump, jump, host.ssh_host, host.ssh_port, timeout)
    try:
        client.connect(
            host.ssh_host, port=host.ssh_port, username=host.ssh_user, key_filename=str(client_key(home)),
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, allow_agent=False, look_for_keys=False,
            sock=sock,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise GlueError(
            f"{host.name}: the host key at {host.ssh_host}:{host.ssh_port} CHANGED since it was pinned; refusing. "
            "If the VM was replaced, run `glue up` to re-pin; otherwise treat this as an attack"
        ) from exc
    except paramiko.AuthenticationException as exc:
        client.close()
        raise GlueError(f"{host.name}: SSH failed: {exc}") from exc
    except paramiko.SSHException as exc:
        client.close()
        if "not found in known_hosts" in str(exc):
            raise GlueError(f"{host.name}: host key not pinned; run `glue up` to refresh known_hosts") from exc
        if "banner" in str(exc):  # no answer in time (a frozen VM): said at once, the watcher's probe counts on it
            raise GlueError(f"{host.name}: SSH failed: {exc}") from exc
        raise _Handshake(str(exc)) from exc
    except EOFError as exc:  # closed mid-handshake (sshd drops connections past MaxStartups): try again
        client.close()
        raise _Handshake("the server closed the connection during the handshake") from exc
    except OSError as exc:
        client.close()
        raise GlueError(f"{host.name}: cannot reach {host.ssh_host}:{host.ssh_port} ({exc.strerror or exc})") from exc
    return client


# Connections kept open for the duration of a `session()`: (home, host id, address) -> client.
_SESSION: ContextVar[dict[tuple[str, str, str, int], paramiko.SSHClient] | None] = ContextVar("ssh_session",
                                                                                             default=None)


@contextmanager
def session() -> Iterator[None]:
    """Reuse one SSH connection per host for every command run inside (a monitor poll runs several
    per node: reachable, process state, ...); all are closed on exit. Outside a session each
    command opens and closes its own connection."""
    if _SESSION.get() is not None:  # nested: the outer session owns the connections
        yield
        return
    pool: dict[tuple[str, str, str, int], paramiko.SSHClient] = {}
    token = _SESSION.set(pool)
    try:
        yield
    finally:
        _SESSION.reset(token)
        for client in pool.values():
            client.close()


@contextmanager
def _connection(home: Path, host: Host) -> Iterator[paramiko.SSHClient]:
    pool = _SESSION.get()
    if pool is None:
        client = connect(home, host)
        try:
            yield client
        finally:
            client.close()
        return
    key = (str(home), host.id, host.ssh_host, host.ssh_port)
    cached = pool.get(key)
    transport = cached.get_transport() if cached is not None else None
    if cached is None or transport is None or not transport.is_active():
        if cached is not None:
            cached.close()
        cached = pool[key] = connect(home, host)
    try:
        yield cached
    except GlueError:
        pool.pop(key, None)  # the connection may be what failed: the next command opens a new one
        cached.close()
        raise


def opened_in_session() -> int:
    """How many connections the current session holds (0 outside one); for tests and benchmarks."""
    return len(_SESSION.get() or {})


def as_root(host: Host, command: str) -> str:
    """What glue runs on a VM needs root. A VM whose login is another user (an image's default, e.g.
    ubuntu) gets there through passwordless sudo: -n fails at once instead of waiting for a password."""
    if host.ssh_user == "root":
        return command
    return f"sudo -n -H -- sh -c {shlex.quote(command)}"


def run(home: Path, host: Host, command: str, timeout: float = 600, stream: bool = False) -> CommandResult:
    """Run `command` on the VM as root; with stream=True its output goes to our stdout/stderr as it comes."""
    with _connection(home, host) as client:
        chan = _open_channel(client, host)
        try:
            chan.settimeout(timeout)
            chan.exec_command(as_root(host, command))
            out, err = bytearray(), bytearray()
            eof_deadline: float | None = None
            while True:
                got = False
                if chan.recv_ready():
                    data = chan.recv(65536)
                    out += data
                    got = True
                    if stream:
                        sys.stdout.buffer.write(data)
                        sys.stdout.flush()
                if chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    err += data
                    got = True
                    if stream:
                        sys.stderr.buffer.write(data)
                        sys.stderr.flush()
                if not got:
                    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                        # sshd can report the exit status before the last output: wait for its EOF, briefly
                        # (a background child that keeps the pipe open must not hang us).
                        eof_deadline = eof_deadline or time.monotonic() + 2.0
                        if chan.eof_received or time.monotonic() > eof_deadline:
                            break
                        time.sleep(0.01)  # status_event is already set: waiting on it would spin
                    else:
                        chan.status_event.wait(0.05)
            code = chan.recv_exit_status()
        except TimeoutError as exc:
            raise GlueError(f"{host.name}: command timed out after {timeout:.0f}s") from exc
        finally:
            chan.close()  # a pooled connection outlives the command: its channel must not
    return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))


def _open_channel(client: paramiko.SSHClient, host: Host) -> paramiko.Channel:
    try:
        return client.get_transport().open_session()  # type: ignore[union-attr]
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise GlueError(f"{host.name}: SSH failed: {exc}") from exc


def reachable(home: Path, host: Host, timeout: float = 3.0) -> bool:
    """True when the VM answers SSH with its pinned key and runs a command."""
    try:
        return run(home, host, "true", timeout=timeout).exit_code == 0
    except GlueError:
        return False


def put_file(home: Path, host: Host, path: str, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` on the VM, created with `mode` (umask first, so a secret is never
    readable by others, not even for a moment). The bytes travel on stdin, never in arguments. The file
    is replaced by a rename: a reader (the trainer rereading refreshed credentials) sees the old file
    or the new one, never a truncated one. Two writers of one path at once (a recovery's verify and prepare
    both push the credentials) each write a temporary file of their own; the last rename wins."""
    umask = 0o777 & ~mode
    directory = path.rsplit("/", 1)[0] or "/"
    new, dest = shlex.quote(f"{path}.gpukit-new-{secrets.token_hex(4)}"), shlex.quote(path)
    cmd = (f"umask {umask:03o} && mkdir -p {shlex.quote(directory)} && cat > {new} && chmod {mode:o} {new} "
           f"&& mv -f {new} {dest}")
    with _connection(home, host) as client:
        chan = _open_channel(client, host)
        try:
            chan.exec_command(as_root(host, cmd))
            chan.sendall(data)
            chan.shutdown_write()
            code = chan.recv_exit_status()
            err = chan.recv_stderr(4096).decode(errors="replace").strip()
        finally:
            chan.close()
    if code != 0:
        raise GlueError(f"{host.name}: could not write {path}: {err or f'exit {code}'}")

"""Which user a fresh VM lets gpukit's key in as, and whether that user can become root.

Lyceum's docs show `ssh root@<ip>` and say the default user depends on the image; a Lyceum CLI
version prints `ubuntu@<ip>`; live VMs (2026) accept the key only for `lyceum`, with passwordless sudo.
Cloud images that disable root often still accept the key for root
but answer every command with 'Please login as the user "ubuntu" rather than the user "root"'
(cloud-init's disable_root). So a login counts only when a command runs: `id -u` prints 0 for
root; any other user must pass `sudo -n true` (passwordless sudo), since every play and every
remote command of glue then runs through sudo.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import paramiko

from glue.errors import GlueError

# Live Lyceum VMs let the key in as `lyceum` only (root and ubuntu refused at publickey); the docs show root;
# cloud images often use ubuntu.
DEFAULT_USERS = ("lyceum", "root", "ubuntu")
_SUGGESTED = re.compile(r'login as the user \\?"?([a-z_][a-z0-9_-]*)\\?"? rather than', re.I)


class _Refused(Exception):
    """This user cannot be used (the reason is the message); another one may."""


def _run(host: str, port: int, host_key: str, key: paramiko.PKey, user: str, command: str,
         timeout: float) -> tuple[int, str]:
    sock = socket.create_connection((host, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        seen = transport.get_remote_server_key()
        if f"{seen.get_name()} {seen.get_base64()}" != host_key:
            raise GlueError(f"the VM at {host}:{port} presented a different host key than the one just pinned")
        try:
            transport.auth_publickey(user, key)
        except paramiko.AuthenticationException:
            raise _Refused(f"{user}: key not accepted") from None
        chan = transport.open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.exec_command(command)
        out = b""
        while True:
            data = chan.recv(4096)
            if not data:
                break
            out += data
        err = chan.makefile_stderr("rb").read()
        return chan.recv_exit_status(), (out + err).decode(errors="replace")
    finally:
        transport.close()


def _try(host: str, port: int, host_key: str, key: paramiko.PKey, user: str, timeout: float) -> str:
    """'' when `user` can run commands as root; raises _Refused with the reason (and the user the
    image suggests instead, if it named one) otherwise."""
    if user == "root":
        code, out = _run(host, port, host_key, key, user, "id -u", timeout)
        if code == 0 and out.strip() == "0":
            return ""
        suggested = _SUGGESTED.search(out)
        raise _Refused(f"root: logged in but commands are refused ({' '.join(out.split())[:120] or f'exit {code}'})"
                       + (f"; suggests {suggested.group(1)}" if suggested else ""),
                       suggested.group(1) if suggested else "")
    code, out = _run(host, port, host_key, key, user, "sudo -n true", timeout)
    if code != 0:
        why = " ".join(out.split())[:120] or f"exit {code}"
        raise _Refused(f"{user}: logs in but has no passwordless sudo ({why})")
    return ""


def problem(host: str, port: int, host_key: str, key_path: Path, user: str, timeout: float = 10.0) -> str | None:
    """None when `user` logs in and gets root (`glue doctor`'s check of a VM); else why not."""
    key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    try:
        _try(host, port, host_key, key, user, timeout)
    except _Refused as exc:
        return str(exc.args[0])
    except (OSError, EOFError, paramiko.SSHException) as exc:
        return f"{user}: {exc or type(exc).__name__}"
    return None


def detect(host: str, port: int, host_key: str, key_path: Path, wanted: str = "", deadline_s: float = 120.0,
           timeout: float = 10.0) -> str:
    """The user to record for the VM: `wanted` (checked) or the first of DEFAULT_USERS (or the one the
    image names) that gets root. Retried until `deadline_s`, as the image may still be setting up."""
    key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    deadline = time.monotonic() + deadline_s
    reasons: dict[str, str] = {}
    while True:
        users = [wanted] if wanted else list(DEFAULT_USERS)
        i = 0
        while i < len(users):
            try:
                _try(host, port, host_key, key, users[i], timeout)
                return users[i]
            except _Refused as exc:
                reasons[users[i]] = str(exc.args[0])
                hint = exc.args[1] if len(exc.args) > 1 else ""
                if hint and hint not in users and not wanted:
                    users.insert(i + 1, hint)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                reasons[users[i]] = f"{users[i]}: {exc or type(exc).__name__}"
            i += 1
        if time.monotonic() >= deadline:
            tried = "; ".join(reasons.values())
            fix = ("set LYCEUM_SSH_USER to the user the image lets in with sudo" if not wanted else
                   "unset LYCEUM_SSH_USER to detect the user, or give the image's user passwordless sudo")
            raise GlueError(f"no login on {host}:{port} gets root ({tried}); {fix}")
        time.sleep(2.0)

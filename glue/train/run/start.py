"""How `glue deploy` and `glue recover` start an attempt on a VM:

    python -m glue.train.run.start /run/gpukit/runs/<run>/attempt-<n>.json

Light on purpose (the standard library only until it falls back): where a warm trainer process for the
attempt's interpreter waits on this VM (a warm spare: glue.train.run.warm, one per environment, its socket
0600 in a 0700 folder of the VM's tmpfs), the launch spec's path goes to it and it becomes the attempt's
supervisor, its trainer forked with the interpreter, torch and the run's imports already loaded. Where
none waits, or it cannot take the attempt, this process becomes the supervisor as before (a cold start),
and its pids file, read into the attempt record, says why: {"start": "cold", "cold_reason": ...}.
Either way the VM now runs an attempt and is no longer an idle spare: the warm processes still waiting
on it (other environments) are ended, so they hold no memory the attempt needs.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import socket
import sys
import time

WARM_DIR = "/run/gpukit/warm"  # on the VM's tmpfs, 0700: only root reaches the socket
WARM_SOCKET = f"{WARM_DIR}/trainer.sock"
SOCKET_ENV = "GPUKIT_WARM_SOCKET"  # another socket (a test on this machine)
ANSWER_S = 30.0
COLD_FLAG = "--cold-reason"  # supervise's second argument: why a warm process did not take the attempt
USAGE = "usage: python -m glue.train.run.start <launch spec (attempt-<n>.json)>"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or WARM_SOCKET


def warm_dir() -> str:
    """The folder of the warm processes' sockets and marks (WARM_DIR on a VM)."""
    return os.path.dirname(socket_path())


def venv_root(python: str) -> str:
    """The environment an interpreter belongs to, links resolved: a run's venv link, the set's folder and
    its copy in memory are one environment."""
    return os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(python))))


def socket_for(python: str) -> str:
    """Where the warm process of `python`'s environment listens: the trainer venv's at socket_path(), a
    run's environment's beside it under its folder's hash."""
    root = venv_root(python)
    if root == os.path.realpath(sys.prefix):
        return socket_path()
    return os.path.join(warm_dir(), f"env-{hashlib.sha256(root.encode()).hexdigest()[:16]}.sock")


def interpreter_of(spec_path: str) -> str:
    """The attempt's interpreter as its command names it (found on the spec's PATH); this one when the
    spec cannot be read (the supervisor then says why)."""
    try:
        with open(spec_path, encoding="utf-8") as fh:
            doc = json.load(fh)
        argv0 = str(doc["command"][0])
        path = doc.get("env", {}).get("PATH")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return sys.executable
    if os.sep in argv0:
        return argv0
    import shutil

    return shutil.which(argv0, path=path) or sys.executable


def warm_pid(pid_file: str) -> int | None:
    """The warm process a pid file names, when it is still one (its command line says so)."""
    try:
        with open(pid_file, encoding="utf-8") as fh:
            pid = int(fh.read().split()[0])
        for _ in range(50):  # an empty command line: the process is inside its exec (its starter just ran)
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            if cmdline:
                return pid if b"glue.train.run.warm\0" in cmdline else None
            time.sleep(0.01)
    except (OSError, ValueError, IndexError):
        return None
    return None


def retire_idle() -> list[int]:
    """End the warm processes still waiting on this VM (listening or loading). The one that took an attempt
    removed its files before it answered, so it is never among them. Returns the pids signalled."""
    ended = []
    folder = warm_dir()
    for pid_file in glob.glob(os.path.join(folder, "*.pid")) + glob.glob(os.path.join(folder, "*.starting")):
        pid = warm_pid(pid_file)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                continue
            ended.append(pid)
    return ended


def hand_over(spec_path: str, path: str, whose: str = "") -> str | None:
    """None: the warm process took the attempt. Else why it did not (the attempt then starts cold). whose:
    the environment the warm process was to hold ('' for the trainer venv's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ANSWER_S)
    with sock:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return f"no warm trainer process for {whose} on this VM" if whose else "no warm trainer process on this VM"
        except OSError as exc:
            return f"the warm trainer process's socket {path} did not answer ({exc.strerror or exc})"
        try:
            sock.sendall(json.dumps({"spec": spec_path}).encode() + b"\n")
            answer = sock.makefile("rb").readline()
        except OSError as exc:
            return f"the warm trainer process did not answer ({exc.strerror or exc})"
    try:
        doc = json.loads(answer)
    except ValueError:
        return "the warm trainer process ended before it answered"
    return None if doc.get("ok") is True else str(doc.get("reason") or "the warm trainer process declined")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    spec_path = os.path.abspath(argv[0])
    python = interpreter_of(spec_path)
    path = socket_for(python)
    reason = hand_over(spec_path, path, "" if path == socket_path() else f"the environment of {python}")
    retire_idle()
    if reason is None:
        return 0
    print(f"gpukit: cold start: {reason}", file=sys.stderr, flush=True)
    # The supervisor as it always runs (tools find it by its command line), told why it starts cold.
    os.execv(sys.executable, [sys.executable, "-m", "glue.train.run.supervise", spec_path, COLD_FLAG, reason])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

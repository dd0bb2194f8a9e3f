"""A warm trainer process, one per idle spare (started by glue.operations.warm_spares):

    python -m glue.train.run.warm [<socket>]      (default /run/gpukit/warm/trainer.sock)

It loads what every attempt's trainer loads (torch, the trainer library, the supervisor and its bucket
client), then waits on a unix socket only root reaches (0600, in a 0700 folder of the VM's tmpfs) for
one launch spec's path from `python -m glue.train.run.start`. An attempt it can run (glue.train.run.
warm_fit) makes it that attempt's supervisor, the trainer forked from it (glue.train.run.warm_child):
what is left of the start is the checkpoint's restore. One it cannot is answered with the reason (the
attempt starts cold and its record says why) and the process ends: the VM is no longer an idle spare.
Either way the socket is gone before the answer, so no second attempt reaches it.

One such process per environment: the trainer venv's, and each live run's own environment the spare holds
(glue.train.spare.arm), started with that environment's interpreter and listening at its own socket
(glue.train.run.start.socket_for). While it waits it follows the runs it was started for (`--follow`, a
file glue.train.spare.arm rewrites): every FOLLOW_S it reads their recorded imports
(glue.train.run.warm_imports) and loads the modules it lacks, so the attempt forked from it skips them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
from pathlib import Path

from glue.train.run import start as start_mod
from glue.train.run import supervise, warm_child, warm_fit
from glue.train.run.launch import LaunchSpec
from glue.train.run.warm_follow import Follow, load
from glue.train.state_paths import StatePaths

PRELOAD = ("torch", "glue.train.run.context", "glue.train.checkpoint", "glue.train.data", "glue.train.storage.target")
FOLLOW_S = 10.0  # how often the followed runs' recorded imports are read while waiting
REQUEST_S = 10.0  # a connected client sends its one line at once


def preload() -> None:
    """What a trainer's start spends its time on, done before any attempt asks. Nothing here may start a
    thread or touch a GPU: the trainer is forked from this process."""
    load(PRELOAD)


def listen(path: str) -> socket.socket:
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    server.listen(4)
    return server


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _ask(conn: socket.socket, stamp: str, follow: Follow | None) -> tuple[str, warm_fit.Entry | str]:
    """The spec's path the client sent and what to run for it, or why not."""
    line = conn.makefile("rb").readline()
    try:
        spec_path = str(json.loads(line)["spec"])
    except (ValueError, KeyError, TypeError):
        return "", "the request was not a launch spec's path"
    try:
        spec = LaunchSpec.from_json(Path(spec_path).read_bytes())
    except (OSError, ValueError, KeyError) as exc:
        return spec_path, f"the warm process cannot read the launch spec {spec_path} ({exc})"
    return spec_path, warm_fit.refusal(spec, stamp, preloaded=follow.preloaded() if follow else None)


def wait_for_attempt(path: str, stamp: str, follow: Follow | None = None) -> tuple[str, warm_fit.Entry] | None:
    """Serve the socket until one attempt from our own user arrives; its spec's path and entry, or None
    when it was declined (answered with the reason). Between requests, the followed runs' imports."""
    server = listen(path)
    server.settimeout(FOLLOW_S)
    pid_file = Path(f"{path}.pid")
    pid_file.write_text(f"{os.getpid()}\n")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}.starting")  # listening now: the starter's mark is no longer needed
    print(f"gpukit warm trainer {os.getpid()}: ready on {path}", flush=True)
    with server:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if follow is not None:
                    follow.refresh()
                continue
            conn.settimeout(REQUEST_S)
            with conn:
                if _peer_uid(conn) != os.getuid():
                    conn.sendall(b'{"ok": false, "reason": "not the warm process\'s user"}\n')
                    continue
                spec_path, fit = _ask(conn, stamp, follow)
                for gone in (path, str(pid_file), f"{path}.starting"):  # no mark of ours is left to end us by
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(gone)
                answer = {"ok": True} if isinstance(fit, warm_fit.Entry) else {"ok": False, "reason": fit}
                conn.sendall(json.dumps(answer).encode() + b"\n")
            if isinstance(fit, warm_fit.Entry):
                return spec_path, fit
            print(f"gpukit warm trainer {os.getpid()}: declined {spec_path or 'a request'}: {fit}", flush=True)
            return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m glue.train.run.warm")
    parser.add_argument("--follow", help="the runs whose recorded imports to load (glue.train.run.warm_follow)")
    parser.add_argument("socket", nargs="?", help=f"default: {start_mod.WARM_SOCKET} (the trainer venv's)")
    args = parser.parse_args(argv)
    path = args.socket or start_mod.socket_path()
    preload()
    follow = Follow(args.follow) if args.follow else None
    if follow is not None:
        follow.refresh()
    got = wait_for_attempt(path, warm_fit.packages_stamp(), follow)
    if got is None:
        return 0
    spec_path, entry = got
    spec = LaunchSpec.from_json(Path(spec_path).read_bytes())
    # From here on this process is the attempt's supervisor: its output goes where a cold one's would.
    out = os.open(StatePaths.of_spec(spec_path, spec.attempt).supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                  0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    return supervise.main(spec_path, warm_child.fork_starter(entry), {"start": "warm"})


def entry(argv: list[str]) -> int:
    """main, and in the forked child the attempt's own code (outside any exception handler, so its own
    traceback is printed as Python prints it)."""
    try:
        return main(argv)
    except warm_child.BecomeTrainer as exc:
        become = exc
    become.__traceback__ = None
    warm_child.run(become)
    return 0


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))

"""How `glue deploy` and `glue recover` start an attempt on a VM:

    python -m glue.train.run.start /run/gpukit/runs/<run>/attempt-<n>.json

Light on purpose (the standard library only until it falls back): where a warm trainer process waits
on this VM (a warm spare: glue.train.run.warm, its socket 0600 in a 0700 folder of the VM's tmpfs), the
launch spec's path goes to it and it becomes the attempt's supervisor, its trainer forked with the
interpreter, torch and the trainer library already loaded. Where none waits, or it cannot take the
attempt (another environment), this process becomes the supervisor as before (a cold start), and its
pids file, read into the attempt record, says why: {"start": "cold", "cold_reason": ...}.
"""

from __future__ import annotations

import json
import os
import socket
import sys

WARM_DIR = "/run/gpukit/warm"  # on the VM's tmpfs, 0700: only root reaches the socket
WARM_SOCKET = f"{WARM_DIR}/trainer.sock"
SOCKET_ENV = "GPUKIT_WARM_SOCKET"  # another socket (a test on this machine)
ANSWER_S = 30.0
COLD_FLAG = "--cold-reason"  # supervise's second argument: why a warm process did not take the attempt
USAGE = "usage: python -m glue.train.run.start <launch spec (attempt-<n>.json)>"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or WARM_SOCKET


def hand_over(spec_path: str, path: str) -> str | None:
    """None: the warm process took the attempt. Else why it did not (the attempt then starts cold)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ANSWER_S)
    with sock:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return "no warm trainer process on this VM"
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
    reason = hand_over(spec_path, socket_path())
    if reason is None:
        return 0
    print(f"gpukit: cold start: {reason}", file=sys.stderr, flush=True)
    # The supervisor as it always runs (tools find it by its command line), told why it starts cold.
    os.execv(sys.executable, [sys.executable, "-m", "glue.train.run.supervise", spec_path, COLD_FLAG, reason])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

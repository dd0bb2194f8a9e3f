"""The entry of a serverless attempt (run.yaml `runtime: lyceum-run`), inside the platform's container:

    python -m glue.train.run.execution <run> <attempt>

The controller put the attempt's launch spec in the bucket (attempts/<n>.launch.json; no secrets: those
arrive in the container's environment) and the platform mounts the bucket at /mnt/s3. This copies the
spec to the container's own disk (0600) and runs the supervisor on it, as `glue deploy` does on a VM, so
the exit record, the shipped log and the trainer's RunContext are the same; the trainer's output is
echoed to this process's stdout too, where the platform's logs API reads it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

from glue.train import trainer_vars
from glue.train.layout import launch_key, run_prefix
from glue.train.run import supervise
from glue.train.state_paths import StatePaths
from glue.train.storage.mount import MOUNT

USAGE = "usage: python -m glue.train.run.execution <run> <attempt>"


def _echo(log: Path, done: threading.Event) -> None:
    """Copy what the trainer writes to its log onto stdout (the platform's log), until `done`."""
    offset = 0
    while True:
        stop = done.wait(1.0)
        try:
            with open(log, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            data = b""
        if data:
            offset += len(data)
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        if stop:
            return


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    run, attempt = argv[0], int(argv[1])
    mount = os.environ.get(trainer_vars.BUCKET_MOUNT, MOUNT)
    source = Path(mount) / run_prefix(run) / launch_key(attempt)
    try:
        spec = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        print(f"gpukit: cannot read the launch spec {source} ({exc}); is the bucket mounted at {mount}?",
              file=sys.stderr)
        return 2
    paths = StatePaths.of(run, attempt, root=str(Path(tempfile.gettempdir()) / "gpukit" / "runs"))
    Path(paths.folder).mkdir(parents=True, exist_ok=True)
    path = Path(paths.spec)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(spec, fh)
    done = threading.Event()
    echo = threading.Thread(target=_echo, args=(Path(paths.log), done), daemon=True)
    echo.start()
    try:
        return supervise.main(str(path))
    finally:
        done.set()
        echo.join(timeout=5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

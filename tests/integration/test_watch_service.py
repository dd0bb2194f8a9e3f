"""`glue watch --detach/--status/--stop` as a real background service, and bad input in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from glue.cloud.local.bucket import LocalBucket
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.kit import Kit

pytestmark = pytest.mark.integration


def _status(kit: Kit) -> dict[str, object]:
    return dict(json.loads(kit.glue("watch", "--status", "--json").stdout))


def _child(pid: int) -> int | None:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout.split()
    return int(out[0]) if out else None


def _until(pred, timeout: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_detached_watcher_is_supervised_and_stops(kit: Kit) -> None:
    assert _status(kit)["running"] is False
    res = kit.glue("watch", "--detach", "--interval", "1")
    assert "watching in the background" in res.stderr
    st = _status(kit)
    assert st["running"] is True and st["mode"] == "daemon" and isinstance(st["pid"], int)
    supervisor = int(st["pid"])
    first = _until(lambda: _child(supervisor))
    _until(lambda: (kit.home / "watch" / "status.json").exists())  # the watcher polled and wrote its table
    again = kit.glue("watch", "--detach", check=False)
    assert again.returncode != 0 and "already runs" in again.stderr and "Traceback" not in again.stderr
    os.kill(first, signal.SIGKILL)  # the watcher dies: the supervisor starts it again
    second = _until(lambda: (c := _child(supervisor)) and c != first and c)
    assert second != first
    assert "stopped pid" in kit.glue("watch", "--stop").stderr
    assert _status(kit)["running"] is False and not (kit.home / "watch" / "watch.pid").exists()
    assert subprocess.run(["kill", "-0", str(second)], capture_output=True, check=False).returncode != 0
    log = (kit.home / "watch" / "watch.log").read_text()
    assert "starting it again" in log


def test_stop_ends_a_watcher_that_does_not_answer_sigterm(kit: Kit) -> None:
    """A watcher stuck in a call (here: SIGSTOPped, so SIGTERM stays pending) is killed after the grace period:
    `--stop` still ends the service, and no watcher is left behind."""
    kit.glue("watch", "--detach", "--interval", "1")
    supervisor = int(_status(kit)["pid"])  # type: ignore[call-overload]
    watcher = _until(lambda: _child(supervisor))
    _until(lambda: (kit.home / "watch" / "status.json").exists())
    os.kill(watcher, signal.SIGSTOP)
    assert "stopped pid" in kit.glue("watch", "--stop").stderr
    assert _status(kit)["running"] is False
    assert subprocess.run(["kill", "-0", str(watcher)], capture_output=True, check=False).returncode != 0
    assert "did not end 10s after SIGTERM; killing it" in (kit.home / "watch" / "watch.log").read_text()


@pytest.mark.parametrize(("args", "says"), [
    (["--stop"], "no detached watcher runs"),
    (["--detach", "--stop"], "--detach, --status and --stop go alone"),
    (["--json"], "--json goes with --status"),
    (["--once", "--run", "no-such-run"], "unknown run 'no-such-run'"),
])
def test_bad_input_is_one_line(kit: Kit, args: list[str], says: str) -> None:
    res = kit.glue("watch", *args, check=False)
    assert res.returncode != 0 and says in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_once_without_run_reads_every_run_in_the_bucket(kit: Kit) -> None:
    """No --run: the watcher lists the bucket's runs itself (none here) and exits 0 after one pass."""
    res = kit.glue("watch", "--once", check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads((kit.home / "watch" / "status.json").read_text())["rows"] == []
    # A Checkpointer of the user's own under runs/ (the README's example target) has no manifest: it is not
    # a run, and no listing, watcher or guard takes it for a broken one.
    bucket = LocalBucket(kit.home)
    s3 = bucket_store.client(bucket.info(), bucket.credentials())
    s3.put_object(Bucket="gpukit", Key=layout.run_prefix("my-run") + layout.commit_key(1), Body=b"{}")
    res = kit.glue("watch", "--once", check=False)
    assert res.returncode == 0 and "my-run" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert json.loads((kit.home / "watch" / "status.json").read_text())["rows"] == []
    assert json.loads(kit.glue("status", "--json").stdout)["runs"] == []

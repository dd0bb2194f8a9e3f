"""`glue watch` keeps runs going with nobody at the keyboard: real VMs, real watcher processes, a loopback
webhook receiver. One test, several runs at once (recoveries are the expensive part)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import IO, Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.runs.store import RunStore
from glue.train import layout
from tests.integration.test_runs import run_config
from tests.kit import GLUE, stop_live_runs

from .conftest import Kit

pytestmark = pytest.mark.e2e


class _Hook(BaseHTTPRequestHandler):
    events: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if body:  # empty: its watcher was killed mid-request (the test kills watchers)
            type(self).events.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Hook)  # loopback only
    _Hook.events = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/gpukit"
    server.shutdown()


def _store(kit: Kit, run: str) -> RunStore:
    bucket = LocalBucket(kit.home)
    return RunStore(bucket.ensure_running(), bucket.credentials(), run)


def _until(what: str, pred: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _step(store: RunStore, attempt: int) -> int:
    beat = store.get_json(layout.heartbeat_key(0)) or {}
    return int(beat.get("step") or 0) if beat.get("attempt") == attempt else 0


class Watchers:
    def __init__(self, kit: Kit, tmp: Path, runs: list[str]) -> None:
        self.kit, self.tmp, self.runs = kit, tmp, runs
        self.procs: list[tuple[subprocess.Popen[str], IO[str]]] = []

    def start(self) -> subprocess.Popen[str]:
        log = open(self.tmp / f"watch-{len(self.procs)}.log", "w")  # closed in stop_all
        args = [a for r in self.runs for a in ("--run", r)]
        proc = subprocess.Popen([*GLUE, "watch", *args, "--interval", "1"], env=self.kit.env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        self.procs.append((proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join((self.tmp / f"watch-{i}.log").read_text() for i in range(len(self.procs)))

    def stop_all(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()


@pytest.mark.timeout(900)
def test_watch_recovers_unattended_within_budgets(cluster_kit: Kit, tmp_path: Path, webhook: str) -> None:
    kit = cluster_kit
    backend = LocalBackend(kit.home)
    notify = {"webhook": webhook}
    main_cfg = run_config(tmp_path, "main.yaml", config={"steps": 150, "step_sleep": 0.1, "checkpoint_interval": 20},
                          recovery={"max_preemptions": 3, "backoff_seconds": 1, "backoff_max_seconds": 2},
                          notify=notify)
    oom_cfg = run_config(tmp_path, "oom.yaml", config={"steps": 5, "d_model": 512, "n_layer": 4, "batch_size": 64},
                         notify=notify)
    keep_cfg = run_config(tmp_path, "keep.yaml", config={"steps": 3000, "step_sleep": 0.1},
                          recovery={"max_failures": 1, "keep_failed": True}, notify=notify)
    stop_live_runs(kit)  # w-keep's recovery replaces gpukit-2: no other test's trainer may live there
    kit.glue("deploy", "--run", "w-keep", "--config", str(keep_cfg), "--vm", "gpukit-2")
    kit.glue("deploy", "--run", "w-oom", "--config", str(oom_cfg), "--vm", "gpukit-2", "--memory-limit-mb", "350")
    kit.glue("deploy", "--run", "w-main", "--config", str(main_cfg), "--vm", "gpukit-1")
    main, keep, oom = _store(kit, "w-main"), _store(kit, "w-keep"), _store(kit, "w-oom")
    watchers = Watchers(kit, tmp_path, ["w-main", "w-keep", "w-oom"])
    w1, w2 = watchers.start(), watchers.start()  # two watchers on the same runs: only one may act
    try:
        # Loss 1, announced: the notice file on the VM, 5 s of grace, then the VM is deleted.
        _until("w-main step 25", lambda: _step(main, 1) >= 25, 120)
        vm1 = main.attempt(1)["vm_id"]
        announcer = threading.Thread(target=backend.announce_termination, args=(vm1, 5.0))
        t_notice = time.monotonic()
        announcer.start()
        # Meanwhile w-keep's supervisor and trainer are killed: `killed`, recovered from the failure budget
        # onto a new VM while the old one is kept for debugging (recovery.keep_failed).
        rec = keep.attempt(1)
        kit.glue("ssh", "gpukit-2", "--", "kill", "-9", str(rec["supervisor_pid"]), str(rec["trainer_pid"]))
        announcer.join()
        first = _until("recovery 1 of w-main", lambda: main.get_json(layout.recovery_key(1)), 240)
        t_recovered = time.monotonic() - t_notice
        notice = main.get_json(layout.notice_key(1, 0))
        assert first["failure_class"] == "preempted" and first["verified"], first
        assert notice["saved_step"] == first["checkpoint_step"]  # the checkpoint taken at the notice
        assert first["failure_step"] - first["checkpoint_step"] <= 1  # at most one step replayed
        assert first["first_resumed_step"] == first["checkpoint_step"] + 1
        krec = _until("w-keep recovery", lambda: keep.get_json(layout.recovery_key(1)), 240)

        # Both watchers are SIGKILLed; a new one carries on from the state in the bucket (w-main to its end,
        # w-keep's budget below). An unannounced loss, a VM deleted (vm_lost), recovered unattended: make test has
        # it in tests/e2e/test_spares.py (onto a spare) and in the frozen-VM test below (onto a new VM); it was
        # twice more here (two recoveries, ~60 s).
        # (Once each watcher has told the hook of its recovery: the notice follows the record, and a watcher
        # killed between the two takes it along; that window is not what this test is about.)
        _until("both recoveries notified", lambda: {("w-main", "recovered"), ("w-keep", "recovered")} <= {
            (e["run"], e["event"]) for e in _Hook.events}, 60)
        for proc in (w1, w2):
            proc.send_signal(signal.SIGKILL)  # not reaped yet: a zombie must not hold a run's lease
        watchers.start()
        _until("w-main completed", lambda: (main.get_json(layout.WATCH_STATE) or {}).get("done"), 240)

        assert main.get_json(layout.recovery_key(2)) is None
        assert main.attempts() == [1, 2]  # one recovery although two watchers saw the loss
        state = main.get_json(layout.WATCH_STATE)
        assert state["used"] == {"preemptions": 1, "failures": 0}
        assert main.get_json(f"{layout.OUTPUTS}/final.json")["step"] == 150

        # w-keep: recovered once (failure budget 1), its old VM kept; the second kill exhausts the budget.
        assert krec["failure_class"] == "killed" and krec["verified"] and krec["kept_vm"]["id"] == rec["vm_id"]
        assert backend.read_vm(rec["vm_id"]) is not None  # still alive for debugging
        kept = json.loads(kit.glue("status", "--json").stdout)["kept"]
        assert [k["id"] for k in kept] == [rec["vm_id"]] and kept[0]["run"] == "w-keep"
        # Reachable for debugging by its id, its host key still pinned (it left the inventory with its name).
        assert kit.glue("ssh", rec["vm_id"], "--", "cat", "/etc/hostname").returncode == 0
        rec2 = keep.attempt(2)
        _until("w-keep attempt 2 steps", lambda: _step(keep, 2) >= 3, 120)
        kit.glue("ssh", "gpukit-2", "--", "kill", "-9", str(rec2["supervisor_pid"]), str(rec2["trainer_pid"]))
        kstate = _until("w-keep stopped", lambda: (keep.get_json(layout.WATCH_STATE) or {}).get("stopped"), 120)
        assert "failures budget is used up (1/1)" in kstate
        assert any(k.endswith("-budget_exhausted.json") for k in keep.keys(layout.INCIDENTS_PREFIX))
        assert keep.attempts() == [1, 2]

        # w-oom: a repeatable OOM is never retried; the hook hears of it.
        assert oom.attempts() == [1] and "oom_host" in (oom.get_json(layout.WATCH_STATE) or {}).get("stopped", "")
        events = {(e["run"], e["event"]) for e in _Hook.events}
        assert {("w-main", "recovered"), ("w-keep", "recovered"), ("w-keep", "budget_exhausted"),
                ("w-oom", "oom")} <= events
        assert sum(1 for e in _Hook.events if e["run"] == "w-main" and e["event"] == "recovered") == 1
        print(f"notice -> recovery 1 recorded in {t_recovered:.1f}s; detect {first['seconds']['detect']}")
    finally:
        logs = watchers.logs() if watchers.procs else ""
        watchers.stop_all()
        for k in json.loads(kit.glue("status", "--json", check=False).stdout or "{}").get("kept", []):
            backend.delete_vm(k["id"])
        kit.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)
        if os.environ.get("GPUKIT_TEST_VERBOSE"):
            print(logs)



def _vm_pids(backend: LocalBackend, vm_id: str) -> list[int]:
    """PID 1 of a local VM's namespace and every process under it."""
    init = int(json.loads((backend.vms_dir / vm_id / "state.json").read_text())["init_pid"])
    pids, todo = [], [init]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def _signal_vm(backend: LocalBackend, vm_id: str, sig: signal.Signals) -> None:
    for _ in range(3):  # again: a process may have forked while the others were being stopped
        for pid in _vm_pids(backend, vm_id):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _gap(later: str, earlier: str) -> float:
    from glue.runs.store import parse_iso

    return (parse_iso(later) - parse_iso(earlier)).total_seconds()


# `stress` (make test-all, since 2026-12-06: the suite's time): make test has the watcher's unattended recoveries
# (the test above), a stopped trainer classed stall with its frames (tests/integration/test_runs.py::
# test_sigstop_is_a_stall_with_stacks) and lost_after's probe (tests/unit/test_watch_probe.py); this adds a whole
# VM frozen under SIGSTOP and a watcher killed mid-recovery.
@pytest.mark.stress
@pytest.mark.timeout(600)
def test_watch_finds_a_frozen_vm_by_lost_after_and_a_stopped_trainer_is_a_stall(cluster_kit: Kit,
                                                                                   tmp_path: Path) -> None:
    """A VM the backend still reports running but that answers nothing (every process SIGSTOPped: sshd,
    the trainer, its heartbeat) is vm_lost within monitor.lost_after_seconds (5) of its last heartbeat,
    and recovered (its watcher SIGKILLed mid-recovery: the next one verifies the resume); a trainer
    stopped on a VM that answers SSH is a stall, not a lost VM."""
    kit = cluster_kit
    backend = LocalBackend(kit.home)
    cfg = run_config(tmp_path, "frozen.yaml", config={"steps": 3000, "step_sleep": 0.1},
                     monitor={"lost_after_seconds": 5}, recovery={"max_failures": 0})
    kit.glue("deploy", "--run", "w-frozen", "--config", str(cfg), "--vm", "gpukit-1")
    store = _store(kit, "w-frozen")
    watchers = Watchers(kit, tmp_path, ["w-frozen"])
    watchers.start()
    frozen: str | None = None
    try:
        _until("w-frozen step 25", lambda: _step(store, 1) >= 25, 120)
        frozen = str(store.attempt(1)["vm_id"])
        _signal_vm(backend, frozen, signal.SIGSTOP)
        rec = _until("attempt 1 classified", lambda: (r := store.attempt(1)).get("failure_class") and r, 60)
        beat = store.get_json(layout.heartbeat_key(0))  # attempt 1's last: its trainer is frozen, attempt 2 not started
        assert beat["attempt"] == 1
        assert backend.read_vm(frozen) is not None  # the backend still reports it
        incident = store.get_json(rec["incident"])
        lag = _gap(incident["detected_at"], beat["updated_at"])
        assert rec["failure_class"] == "vm_lost" and "SSH does not answer" in rec["reason"], rec
        assert lag <= 5.0, f"detected {lag:.2f}s after the last heartbeat"
        # The watcher is SIGKILLed mid-recovery, once the new attempt runs (its resume plan is saved): the
        # next watcher checks that resume as `glue recover` would have.
        _until("attempt 2 started", lambda: (store.get_json(layout.WATCH_STATE) or {}).get("resume_plan"), 300)
        watchers.procs[0][0].send_signal(signal.SIGKILL)
        watchers.procs[0][0].wait()  # reaped, as its supervisor (systemd, the daemon) would
        watchers.start()
        first = _until("recovery 1", lambda: store.get_json(layout.recovery_key(1)), 300)
        assert first["failure_class"] == "vm_lost" and first["verified"] and first["interrupted"], first
        actions = [h["action"] for h in store.get_json(layout.WATCH_STATE)["history"]]
        seen = [a for a in actions if a in ("recovering", "recovery_interrupted", "recovered")]
        assert seen == ["recovering", "recovery_interrupted", "recovered"], actions
        assert backend.read_vm(frozen) is None  # the frozen VM was replaced
        frozen = None

        # The trainer stopped, the VM answering: stall (the failure budget is 0: stopped, not recovered).
        rec2 = store.attempt(2)
        _until("attempt 2 steps", lambda: _step(store, 2) >= first["checkpoint_step"] + 5, 120)
        kit.glue("ssh", "gpukit-1", "--", "kill", "-STOP", str(rec2["trainer_pid"]))
        stopped = _until("w-frozen stopped", lambda: (store.get_json(layout.WATCH_STATE) or {}).get("stopped"), 120)
        rec2 = store.attempt(2)
        beat2 = store.get_json(layout.heartbeat_key(0))
        incident2 = store.get_json(rec2["incident"])
        stall_lag = _gap(incident2["detected_at"], beat2["updated_at"])
        assert rec2["failure_class"] == "stall" and "state T" in rec2["reason"], rec2
        # The stall's incident has the stopped trainer's frames (py-spy reads a stopped process as it stands).
        stacks = incident2["stacks"] or ""
        assert "tiny_gpt.py:" in stacks and "Failed to get stack traces" not in stacks, stacks
        assert "failures budget is used up (0/0)" in stopped and store.attempts() == [1, 2]
        print(f"frozen VM: vm_lost {lag:.2f}s after its last heartbeat (recovery detect "
              f"{first['seconds']['detect']}s from the last step); stopped trainer: stall after {stall_lag:.2f}s")
    finally:
        logs = watchers.logs() if watchers.procs else ""
        watchers.stop_all()
        if frozen is not None and backend.read_vm(frozen) is not None:
            _signal_vm(backend, frozen, signal.SIGCONT)  # the session's cluster goes on with it
        last = store.attempt(store.attempts()[-1])
        kit.glue("ssh", "gpukit-1", "--", "kill", "-9", str(last.get("supervisor_pid")), str(last.get("trainer_pid")),
                 check=False)
        if os.environ.get("GPUKIT_TEST_VERBOSE"):
            print(logs)

"""The loop a user relies on: lose a VM mid-run, recover onto a new one, prove the resume exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glue.cloud.local.backend import LocalBackend
from glue.cloud.local.bucket import LocalBucket
from glue.cluster import current
from glue.runs import guard
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.integration.test_runs import here, run_config, s3, wait_for
from tests.kit import stop_live_runs

from .conftest import Kit

pytestmark = pytest.mark.e2e


def bucket_json(kit: Kit, key: str) -> Any:
    data = bucket_store.read_json(s3(kit), "gpukit", key)
    assert data is not None, f"{key} is not in the bucket"
    return data


def vm_id(kit: Kit, name: str) -> str:
    return next(v["id"] for v in json.loads(kit.glue("status", "--json").stdout)["vms"] if v["name"] == name)


# In these tests the recover/down/deploy commands under test run as real `glue` processes (kit); the
# polls and look-ups around them (status, ssh, the bucket address) run in this process (fast = here(kit)).
def test_recover_refuses_oom_and_healthy_runs(cluster_kit: Kit, oom_run: str, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    before = vm_id(fast, "gpukit-2")
    res = kit.glue("recover", "--run", oom_run, check=False)  # OOM-killed on gpukit-2 (tests/kit.py)
    assert res.returncode != 0 and "oom_host" in res.stderr, res.stderr
    assert f"investigate with `glue memprobe --run {oom_run}`" in " ".join(res.stderr.split()), res.stderr
    assert "Traceback" not in res.stderr and vm_id(fast, "gpukit-2") == before  # nothing destroyed

    # One run for the rest (one trainer start): refused while healthy, then killed before its first checkpoint
    # (2000 steps away, minutes): recovery only from scratch, and only when asked.
    cfg = run_config(tmp_path, "long.yaml", config={"steps": 3000, "step_sleep": 0.1, "checkpoint_interval": 2000},
                     checkpoint={"interval_steps": 2000})
    kit.glue("deploy", "--run", "healthy", "--config", str(cfg), "--vm", "gpukit-2")
    try:
        wait_for(fast, "healthy", lambda s: (s["step"] or 0) >= 2)
        res = kit.glue("recover", "--run", "healthy", check=False)
        assert res.returncode != 0 and "is healthy" in res.stderr and vm_id(fast, "gpukit-2") == before
        res = kit.glue("down", check=False)
        assert res.returncode != 0 and "healthy is still running" in res.stderr
        assert vm_id(fast, "gpukit-2") == before

        rec = bucket_json(fast, layout.run_prefix("healthy") + layout.attempt_key(1))
        fast.glue("ssh", "gpukit-2", "--", "kill", "-9", str(rec["trainer_pid"]))
        wait_for(fast, "healthy", lambda s: s["state"] != "running")
        res = kit.glue("recover", "--run", "healthy", check=False)
        assert res.returncode != 0 and "--from-scratch" in res.stderr and vm_id(fast, "gpukit-2") == before

        # The local bucket's server stopped: recover starts it again (same port) and gives its real answer;
        # nothing destroyed.
        server = LocalBucket(kit.home)
        endpoint = server.info().endpoint
        server.stop()
        res = kit.glue("recover", "--run", "healthy", check=False)
        assert res.returncode != 0 and "--from-scratch" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert server.running() and server.info().endpoint == endpoint
        assert vm_id(fast, "gpukit-2") == before
    finally:
        fast.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)


def test_recover_bad_input(cluster_kit: Kit) -> None:
    res = cluster_kit.glue("recover", "--run", "no-such-run", check=False)
    assert res.returncode != 0 and "unknown run 'no-such-run'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # A run killed before its first checkpoint, and a stopped bucket server: test_recover_refuses_oom_and_healthy_runs.


# `stress` (make test-all): make test catches the same wrong resume (skip_rng) in a watcher's recovery
# (tests/integration/test_runs.py::test_a_watcher_whose_recovery_resumes_wrongly_stops_the_run_as_a_bad_restart).
@pytest.mark.stress
def test_drill_fails_a_resume_that_skips_rng(cluster_kit: Kit, tmp_path: Path) -> None:
    kit = cluster_kit
    cfg = run_config(tmp_path, config={"steps": 60, "step_sleep": 0.1, "broken_resume": "skip_rng",
                                       "checkpoint_interval": 10}, checkpoint={"interval_steps": 10},
                     monitor={"heartbeat_seconds": 0.5})
    res = kit.glue("drill", "--run", "broken", "--config", str(cfg), "--kill-at", "25", check=False, timeout=900)
    assert res.returncode == 1, res.stderr
    assert "FAIL" in res.stderr and "first differing step" in res.stderr
    text = " ".join(res.stderr.split())
    assert "(lost: rng)" in text, res.stderr
    # Exact: the trainer held at the asked step, so the VM died there, not at the next heartbeat.
    assert "asked to destroy the VM at step 25" in text and "VM destroyed at step 25" in text, res.stderr
    assert "resumed from checkpoint 20" in text and "steps replayed 5 (21..25)" in text, res.stderr


@pytest.mark.timeout(900)
def test_make_demo_passes_and_records_the_recovery(tmp_path: Path) -> None:
    """The demo flow (up, deploy, lose a VM, recover, verify, down), then its records step by step."""
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path / "home")}
    demo_home = tmp_path / "home" / "demo"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "glue.operations.recovery.demo"], env=env, capture_output=True,
                          text=True,
                          timeout=900)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "PASS" in proc.stderr and "resume verified" in proc.stderr
        # down left no VM behind, and the bucket still holds every record.
        assert not (demo_home / "vms").exists() or list((demo_home / "vms").iterdir()) == []
        kit = Kit(home=demo_home, env={**os.environ, "GPUKIT_HOME": str(demo_home)})
        runs = json.loads(kit.glue("status", "--json").stdout)["runs"]
        [drill_run] = [r for r in runs if r.endswith("-drill1")]
        rec = bucket_json(kit, layout.run_prefix(drill_run) + layout.recovery_key(1))
        assert rec["verified"] and rec["failure_class"] == "vm_lost" and rec["new_vm"]["id"] != rec["old_vm"]["id"]
        assert rec["first_resumed_step"] == rec["checkpoint_step"] + 1 and rec["checkpoint_step"] % 20 == 0
        # Steps between the checkpoint and the last heartbeat before the loss are compared exactly; the
        # VM can die right at a checkpoint, and then there is nothing to replay (the drill compares all).
        if rec["failure_step"] > rec["checkpoint_step"]:
            assert rec["compared_steps"] and rec["compared_steps"][0] == rec["checkpoint_step"] + 1
        assert set(rec["seconds"]) == {"detect", "validate", "provision", "configure", "verify", "restore", "replay"}
        assert all(v is not None and v >= 0 for v in rec["seconds"].values())
        assert rec["work_lost"]["steps"] == rec["failure_step"] - rec["checkpoint_step"]
        drill_rec = bucket_json(kit, layout.run_prefix(drill_run) + layout.DRILL)
        assert drill_rec["passed"] and drill_rec["compared_steps"] == 60 and drill_rec["compared_tensors"] > 0
        # The VM died at the asked step (the trainer held there), and recovery reached exactly that step.
        assert drill_rec["destroyed_at"] == drill_rec["kill_at"] == rec["failure_step"]
        classes = [i["class"] for i in json.loads(kit.glue("incidents", "--run", drill_run, "--json").stdout)]
        # A save cut off by the VM loss is an interrupted save: the resume skips it and records that.
        assert "vm_lost" in classes and set(classes) <= {"vm_lost", "ckpt_interrupted", "ckpt_corrupt"}
        advice = json.loads(kit.glue("advise", "--run", drill_run, "--json").stdout)
        assert advice["restore_s"] == pytest.approx(rec["seconds"]["restore"])
        assert advice["options"]["young"]["interval_s"] > 0
    finally:
        backend = LocalBackend(demo_home)
        for vm in backend.list_vms():
            backend.delete_vm(vm.id)
        LocalBucket(demo_home).stop()
    print(f"demo took {time.monotonic() - t0:.0f}s")


def _two_recovers(kit: Kit, run: str, stagger_s: float) -> list[subprocess.CompletedProcess[str]]:
    """Two real `glue recover --run` processes, the second `stagger_s` after the first."""
    procs = []
    for k in range(2):
        if k and stagger_s:
            time.sleep(stagger_s)
        procs.append(subprocess.Popen([sys.executable, "-m", "glue.cli", "recover", "--run", run], env=kit.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


# `stress` (make test-all): make test has two watchers of one loss making exactly one recovery
# (tests/e2e/test_watch.py); here it is two `glue recover` commands.
@pytest.mark.stress
def test_two_recovers_of_one_run_start_exactly_one_attempt(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 2000, "step_sleep": 0.05, "checkpoint_interval": 10},
                     checkpoint={"interval_steps": 10})
    kit.glue("deploy", "--run", "two-rec", "--config", str(cfg), "--vm", "gpukit-2")
    try:
        for attempt, stagger in ((1, 0.0), (2, 3.0)):  # started together, then the second 3 s later
            wait_for(fast, "two-rec", lambda s: (s["step"] or 0) >= 15 and s["state"] == "running", timeout=180)
            rec = bucket_json(fast, layout.run_prefix("two-rec") + layout.attempt_key(attempt))
            fast.glue("ssh", rec["vm"], "--", "kill", "-9", str(rec["trainer_pid"]))
            wait_for(fast, "two-rec", lambda s: s["state"] != "running")
            results = _two_recovers(kit, "two-rec", stagger)
            ok = [r for r in results if r.returncode == 0]
            refused = [r for r in results if r.returncode != 0]
            assert len(ok) == 1 and len(refused) == 1, [r.stderr[-2000:] for r in results]
            line = refused[0].stderr.strip()
            assert "two-rec is being changed by" in line and "recover" in line and "Traceback" not in line, line
            assert len(line.splitlines()) == 1, line
            under = layout.run_prefix("two-rec") + layout.ATTEMPTS_PREFIX
            attempts = sorted(k for k in fast_keys(fast, under) if k.count(".") == 1)
            assert attempts == [f"{n}.json" for n in range(1, attempt + 2)], attempts
    finally:
        for vm in ("gpukit-1", "gpukit-2"):
            fast.glue("ssh", vm, "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)


# Under systemd the gpukit-mount unit would clean up and restart a killed rclone 5 s later; for a mount
# that dies for good (as once its restarts are spent) a runtime drop-in turns both off first.
_FOR_GOOD = ("if [ \"$(cat /proc/1/comm)\" = systemd ]; then d=/run/systemd/system/gpukit-mount.service.d; "
             "mkdir -p $d && printf '[Service]\\nRestart=no\\nExecStopPost=\\n' > $d/dies-for-good.conf && "
             "systemctl daemon-reload; fi; ")


def _kill_mount(kit: Kit, vm: str) -> None:
    """SIGKILL the mount's supervisor (none under systemd) and rclone: the FUSE mount stays, dead."""
    kit.glue("ssh", vm, "--", "sh", "-c", _FOR_GOOD + "pkill -9 -f '[g]pukit-mount supervise'; "
             "pkill -9 -f '[r]clone mount'; sleep 1", check=False)


def fast_keys(kit: Kit, prefix: str) -> list[str]:
    resp = s3(kit).list_objects_v2(Bucket="gpukit", Prefix=prefix)
    return [o["Key"][len(prefix):] for o in resp.get("Contents", [])]


# `stress` (make test-all): make test has a mount lost under a live trainer classed storage_lost and recovered
# (the test below) and the unit restarting a killed rclone (tests/integration/test_ansible.py).
@pytest.mark.stress
def test_rclone_killed_under_the_mount_is_storage_lost_though_the_unit_brought_it_back(cluster_kit: Kit,
                                                                                       tmp_path: Path) -> None:
    """README troubleshooting: rclone died under the mount -> storage_lost. The unit restarts it within
    seconds, so the trainer's error may be ENOTCONN (the dead mount) or ENOENT (the bare directory between
    two mounts), and glue may look only once the mount is live again: the unit's restart is the evidence."""
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 3000, "step_sleep": 0.05, "checkpoint_interval": 10,
                                       "log_dir": "/mnt/s3/rclone-killed-logs"}, checkpoint={"interval_steps": 10})
    kit.glue("deploy", "--run", "rclone-killed", "--config", str(cfg), "--vm", "gpukit-1")
    try:
        wait_for(fast, "rclone-killed", lambda s: (s["step"] or 0) >= 25)
        killed_at = time.time()
        fast.glue("ssh", "gpukit-1", "--", "pkill", "-9", "-f", "[r]clone mount", check=False)
        st = wait_for(fast, "rclone-killed", lambda s: s["state"] != "running", timeout=120)
        assert st["state"] == "storage_lost", (st, st.get("incident") and
                                               bucket_json(fast, layout.run_prefix("rclone-killed") + st["incident"]))
        # The evidence once the mount is back (the trainer's error alone may be a bare ENOENT under /mnt/s3).
        host = current.host(kit.home, "gpukit-1")
        deadline = time.monotonic() + 60
        while (said := guard.mount_restarted_since(kit.home, host, killed_at - 1)) is None:
            assert time.monotonic() < deadline, "the unit never restarted the mount"
            time.sleep(1)
        assert "the bucket mount at /mnt/s3 on gpukit-1 restarted during the attempt (its rclone died" in said
        assert guard.mount_restarted_since(kit.home, host, time.time() + 1) is None
    finally:
        fast.glue("ssh", "gpukit-1", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)
        deadline = time.monotonic() + 60  # the unit remounts within seconds: the tests after this one need it
        while fast.glue("ssh", "gpukit-1", "--", "sh", "-c", "findmnt -n /mnt/s3 && stat /mnt/s3",
                        check=False).returncode != 0:
            assert time.monotonic() < deadline, "the bucket mount did not come back"
            time.sleep(1)


# `stress` (make test-all, since 2026-12-06: the suite's time): make test classes a bucket that stops answering
# under a live trainer storage_lost (tests/integration/test_runs.py) and recovers a lost VM without --force
# (test_make_demo_passes_and_records_the_recovery); this joins them through the mount.
@pytest.mark.stress
def test_a_mount_lost_mid_run_is_storage_lost_and_recovers_without_force(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    # The kit's own checkpoints go through the S3 API; the trainer's own step log goes through the mount,
    # as a user's logs or artifacts would.
    cfg = run_config(tmp_path, config={"steps": 3000, "step_sleep": 0.05, "checkpoint_interval": 10,
                                       "log_dir": "/mnt/s3/mount-lost-logs"}, checkpoint={"interval_steps": 10})
    stop_live_runs(fast)  # its recovery replaces gpukit-2: no other test's trainer may live there
    kit.glue("deploy", "--run", "mount-lost", "--config", str(cfg), "--vm", "gpukit-2")
    try:
        wait_for(fast, "mount-lost", lambda s: (s["step"] or 0) >= 25)
        # rclone's FUSE daemon dies for good: /mnt/s3 answers ENOTCONN, the trainer's next write fails.
        _kill_mount(fast, "gpukit-2")
        assert fast.glue("ssh", "gpukit-2", "--", "stat", "/mnt/s3", check=False).returncode != 0, "mount still up"
        st = wait_for(fast, "mount-lost", lambda s: s["state"] != "running", timeout=120)
        assert st["state"] == "storage_lost", (st, st.get("incident") and
                                               bucket_json(fast, layout.run_prefix("mount-lost") + st["incident"]))
        # A deploy that needs the dead mount names it (not "plain directory").
        dead_cfg = run_config(tmp_path, "dead.yaml", checkpoint={"target": "/mnt/s3/runs/{run}"})
        res = kit.glue("deploy", "--run", "mount-dead", "--config", str(dead_cfg), "--vm", "gpukit-2", check=False)
        assert res.returncode != 0 and "bucket mount at /mnt/s3" in res.stderr and "dead" in res.stderr, res.stderr
        assert "plain directory" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
        res = kit.glue("recover", "--run", "mount-lost", timeout=600)  # no --force: infrastructure failed
        assert "resume verified" in " ".join(res.stderr.split()) + " ".join(res.stdout.split()), res.stderr
    finally:
        for vm in ("gpukit-1", "gpukit-2"):
            fast.glue("ssh", vm, "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)
        if fast.glue("ssh", "gpukit-2", "--", "stat", "/mnt/s3", check=False).returncode != 0:
            kit.glue("up", timeout=600)  # remount for the tests after this one (recover gave a new VM otherwise)

"""Runs on local VMs: deploy tiny_gpt, watch it, and classify how it ends."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from glue.cloud.local.bucket import LocalBucket
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store
from tests.kit import stop_live_runs

from .conftest import Kit

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


# The model of a test's run unless the test sizes it: what a test proves (classes, resumes, losses equal) holds at
# any size, and the example's model (d_model 64, 2 layers, batch 8 x 64) cost ~30 ms of CPU a step, the suite's
# trainers most of its CPU on a 2-core host (py-spy, 2026-12-06); this one ~3 ms.
SMALL_MODEL = {"d_model": 16, "n_layer": 1, "batch_size": 4, "seq_len": 16}


def run_config(tmp_path: Path, name: str = "run.yaml", **overrides: Any) -> Path:
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_gpt.yaml").read_text())
    # A heartbeat gap on a loaded 2-core machine is not a stall: a test of stall detection sets its own
    # timeout (or stops the trainer: a stopped process is a stall at once), the rest cannot be classed so.
    cfg["monitor"]["stall_timeout_seconds"] = 180
    if not set(SMALL_MODEL) & set(overrides.get("config", {})):
        cfg["config"].update(SMALL_MODEL)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def status(kit: Kit, run: str) -> dict[str, Any]:
    return json.loads(kit.glue("status", "--run", run, "--json").stdout)


def wait_for(kit: Kit, run: str, pred: Any, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = status(kit, run)
        if pred(st):
            return st
        time.sleep(1)
    raise AssertionError(f"run {run} never reached the expected state; last: {st}")


def s3(kit: Kit):  # type: ignore[no-untyped-def]
    st = json.loads(kit.glue("status", "--json").stdout)["bucket"]
    from glue.cloud.base import BucketInfo

    return bucket_store.client(BucketInfo(st["endpoint"], st["name"], st["region"]),
                               LocalBucket(kit.home).credentials())


def run_objects(kit: Kit, run: str) -> list[str]:
    resp = s3(kit).list_objects_v2(Bucket="gpukit", Prefix=f"runs/{run}/")
    return [o["Key"] for o in resp.get("Contents", [])]


def trainer_pid(kit: Kit, run: str) -> int:
    rec = json.loads(s3(kit).get_object(Bucket="gpukit", Key=f"runs/{run}/attempts/1.json")["Body"].read())
    return int(rec["trainer_pid"])


def vm_exec(kit: Kit, vm: str, *cmd: str) -> str:
    return kit.glue("ssh", vm, "--", *cmd).stdout


class InProcessKit(Kit):
    """`glue ARGS` run in this process (click's test runner): the same commands and output as Kit.glue,
    without a fresh interpreter per call (most of a `glue` process is importing torch and friends, ~3 s
    on the CI machine). For the polls and look-ups around what a test checks (status, ssh, the bucket
    address); the commands a test is about still run as real `glue` processes through the session kit."""

    def glue(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        from click.testing import CliRunner

        from glue.cli import cli

        res = CliRunner().invoke(cli, list(args), env=env or self.env, catch_exceptions=False)
        proc = subprocess.CompletedProcess(["glue", *args], res.exit_code, res.stdout, res.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"glue {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc


def here(kit: Kit) -> Kit:
    """The kit whose `glue` runs in this process (InProcessKit)."""
    return InProcessKit(home=kit.home, env=kit.env)


@pytest.fixture(scope="module")
def completed_run(cluster_kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-step run completed on gpukit-1, for the tests that only read a finished run (its name taken, a refused
    resume, its status with the bucket started on demand, a watcher taking it on): one trainer start for all."""
    cfg = run_config(tmp_path_factory.mktemp("done"), config={"steps": 2, "step_sleep": 0})
    cluster_kit.glue("deploy", "--run", "done", "--config", str(cfg), "--vm", "gpukit-1")
    st = wait_for(here(cluster_kit), "done", lambda s: s["state"] != "running", timeout=90)
    assert st["state"] == "completed", st
    return "done"


def test_heartbeat_advances_then_kill9_is_classified(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 400, "step_sleep": 0.05})
    kit.glue("deploy", "--run", "hb-kill", "--config", str(cfg), "--vm", "gpukit-1")
    first = wait_for(fast, "hb-kill", lambda s: (s["step"] or 0) >= 3)
    second = wait_for(fast, "hb-kill", lambda s: (s["step"] or 0) > first["step"])
    assert second["state"] == "running"
    manifest = json.loads(s3(fast).get_object(Bucket="gpukit", Key="runs/hb-kill/manifest.json")["Body"].read())
    assert manifest["code"]["git_sha"] and manifest["environment"]["torch"].startswith("2.13")
    assert manifest["secrets"] == [] and manifest["input"]["version"] == "seed-1234"
    vm_exec(fast, "gpukit-1", "kill", "-9", str(trainer_pid(fast, "hb-kill")))
    wait_for(fast, "hb-kill", lambda s: s["state"] != "running")
    st = status(kit, "hb-kill")  # what the real `glue status` prints
    assert st["state"] == "killed" and "SIGKILL" in st["reason"]
    [inc] = json.loads(kit.glue("incidents", "--run", "hb-kill", "--json").stdout)
    assert inc["class"] == "killed" and inc["last_completed_step"] >= second["step"]
    for key in ("error_excerpt", "input", "code", "environment", "last_valid_checkpoint", "detected_at"):
        assert key in inc


def test_memory_limit_overrun_is_host_oom(cluster_kit: Kit, oom_run: str) -> None:
    kit = cluster_kit  # oom_run: deployed with --memory-limit-mb 350 on gpukit-2 (tests/kit.py)
    st = status(kit, oom_run)
    assert st["state"] == "oom_host", st
    # `glue status` names the memprobe command that works for the run in place of the class's policy.
    assert st["policy"] == ("no blind restart: it repeats at this input; investigate with "
                            f"`glue memprobe --run {oom_run}`"), st
    inc = json.loads(kit.glue("incidents", "--run", oom_run, "--json").stdout)[0]
    assert inc["next_step"] == f"glue memprobe --run {oom_run}"
    assert "memprobe" in kit.glue("incidents", "--run", oom_run).stdout


# In make test (since 2026-12-06, in place of the watcher's frozen-VM e2e, now make test-all's): a stopped
# trainer is a stall under `glue status` alone with a 4 s stall timeout, its frames in the incident.
def test_sigstop_is_a_stall_with_stacks(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 1000, "step_sleep": 0.05}, monitor={"stall_timeout_seconds": 4})
    kit.glue("deploy", "--run", "stall", "--config", str(cfg), "--vm", "gpukit-2")
    wait_for(fast, "stall", lambda s: (s["step"] or 0) >= 2)
    pid = trainer_pid(fast, "stall")
    vm_exec(fast, "gpukit-2", "kill", "-STOP", str(pid))
    try:
        wait_for(fast, "stall", lambda s: s["state"] != "running", timeout=60)
        assert status(kit, "stall")["state"] == "stall"
        [inc] = json.loads(kit.glue("incidents", "--run", "stall", "--json").stdout)
        # The frames themselves (py-spy cannot pause a stopped process: it is read as it stands).
        assert "tiny_gpt.py:" in inc["stacks"] and "Failed to get stack traces" not in inc["stacks"], inc["stacks"]
    finally:
        vm_exec(fast, "gpukit-2", "kill", "-9", str(pid))


def test_outputs_on_vm_disk_refused_before_start(cluster_kit: Kit, tmp_path: Path) -> None:
    kit = cluster_kit
    cfg = run_config(tmp_path, outputs={"destination": "/root/out"})
    res = kit.glue("deploy", "--run", "disk-out", "--config", str(cfg), "--vm", "gpukit-1", check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "/root/out" in res.stderr and "wiped when the VM terminates" in res.stderr
    assert run_objects(here(kit), "disk-out") == []


def test_mount_path_accepted_when_live_refused_when_unmounted(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 4, "step_sleep": 0}, outputs={"destination": "/mnt/s3/out/{run}"})
    kit.glue("deploy", "--run", "mount-ok", "--config", str(cfg), "--vm", "gpukit-1")
    vm = "gpukit-2"
    unmount = "pkill -f 'sbin/[g]pukit-mount'; sleep 0.5; fusermount3 -uz /mnt/s3 || umount -l /mnt/s3 || true"
    vm_exec(fast, vm, "sh", "-c", unmount)
    try:
        res = kit.glue("deploy", "--run", "mount-gone", "--config", str(cfg), "--vm", vm, check=False)
        assert res.returncode != 0 and "not a live bucket mount" in res.stderr, res.stderr
        assert run_objects(fast, "mount-gone") == []
    finally:
        # Mount it again for the tests after this one: the playbook's own mount step (`gpukit-mount start`
        # waits until the mount answers, else fails) on this VM, not a whole `glue up`.
        vm_exec(fast, vm, "/usr/local/sbin/gpukit-mount", "start")


def test_finished_without_required_outputs_is_export_missing(cluster_kit: Kit, tmp_path: Path) -> None:
    kit = cluster_kit
    cfg = run_config(tmp_path, config={"steps": 3, "step_sleep": 0, "skip_outputs": True})
    kit.glue("deploy", "--run", "no-out", "--config", str(cfg), "--vm", "gpukit-1")
    wait_for(here(kit), "no-out", lambda s: s["state"] != "running", timeout=90)
    st = status(kit, "no-out")
    assert st["state"] == "export_missing" and "model.pt" in st["reason"]
    res = kit.glue("recover", "--run", "no-out", check=False)
    assert res.returncode == 1 and ("run no-out finished, but required outputs are missing from the bucket (model.pt, "
                                    "final.json); a restart does not fix that: export them") in res.stderr, res.stderr


def test_a_bad_trainer_config_is_one_line_in_the_log_and_a_user_error(cluster_kit: Kit, tmp_path: Path) -> None:
    """README: tiny_gpt refuses `steps: -5` in one line, deployed too (no traceback in the run's log)."""
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": -5})
    kit.glue("deploy", "--run", "neg", "--config", str(cfg), "--vm", "gpukit-1")
    st = wait_for(fast, "neg", lambda s: s["state"] != "running", timeout=90)
    assert st["state"] == "user_error", st
    log = kit.glue("logs", "--run", "neg").stdout
    assert "tiny_gpt: config.steps must be >= 1, got -5" in log and "Traceback" not in log, log
    [inc] = json.loads(kit.glue("incidents", "--run", "neg", "--json").stdout)
    assert "config.steps must be >= 1, got -5" in json.dumps(inc), inc


OK = "command: [python]\noutputs: {destination: s3://gpukit/x}\ncheckpoint: {target: s3://gpukit/x}\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("command: [python\n  bad: [", "not valid YAML"),
        ("command: [python]\noutputs: {destination: s3://gpukit/x}\ncheckpoint: {target: s3://gpukit/x}\n"
         "colour: blue\n", "unknown key 'colour'"),
        ("outputs: {destination: s3://gpukit/x}\ncheckpoint: {target: s3://gpukit/x}\n", "missing command"),
        ("command: [python]\noutputs: {destination: s3://gpukit/x, required: [a], when: now}\n"
         "checkpoint: {target: s3://gpukit/x}\n", "unknown key 'when' in outputs"),
        (f"{OK}monitor: {{heartbeat_seconds: abc}}\n", "monitor.heartbeat_seconds: must be a number"),
        (f"{OK}monitor: {{heartbeat_seconds: 0}}\n", "monitor.heartbeat_seconds"),
        (f"{OK}monitor: {{stall_timeout_seconds: -1}}\n", "monitor.stall_timeout_seconds"),
    ],
)
def test_bad_run_config_is_one_line_and_writes_nothing(cluster_kit: Kit, tmp_path: Path, text: str,
                                                       needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    res = cluster_kit.glue("deploy", "--run", "bad-cfg", "--config", str(path), check=False)
    assert res.returncode != 0 and needle in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert run_objects(here(cluster_kit), "bad-cfg") == []


@pytest.mark.parametrize("limit", ["-5", "0"])
def test_bad_memory_limit_is_one_line_and_writes_nothing(cluster_kit: Kit, tmp_path: Path, limit: str) -> None:
    cfg = run_config(tmp_path, config={"steps": 2, "step_sleep": 0})
    res = cluster_kit.glue("deploy", "--run", "bad-mem", "--config", str(cfg), "--memory-limit-mb", limit,
                           check=False)
    assert res.returncode != 0 and "--memory-limit-mb" in res.stderr and "Traceback" not in res.stderr
    assert run_objects(here(cluster_kit), "bad-mem") == []


def test_duplicate_run_and_unknown_vm_refused(cluster_kit: Kit, completed_run: str, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 2, "step_sleep": 0})
    before = run_objects(fast, completed_run)
    res = kit.glue("deploy", "--run", completed_run, "--config", str(cfg), check=False)
    assert res.returncode != 0 and "already exists" in res.stderr, res.stderr
    res = kit.glue("deploy", "--run", "other", "--config", str(cfg), "--vm", "nope", check=False)
    assert res.returncode != 0 and "unknown VM 'nope'" in res.stderr
    assert run_objects(fast, "other") == []
    assert set(before) <= set(run_objects(fast, completed_run))
    assert os.environ.get("GPUKIT_HOME") != str(kit.home)


def test_uploads_pending_in_a_vms_mount_cache_block_its_destruction(cluster_kit: Kit) -> None:
    """What `glue down` (and an up that would remove VMs) checks first, asked without destroying anything:
    a file the VM's /mnt/s3 write cache has not uploaded yet is named, with its VM."""
    from glue.operations import down_guard

    meta = f"{down_guard.VFS_META}/gpukit/guard-test"
    vm_exec(here(cluster_kit), "gpukit-2", "sh", "-c",
            f"mkdir -p {meta} && echo '{{\"Dirty\": true}}' > {meta}/pending.bin")
    try:
        reasons = down_guard.blockers(cluster_kit.home)
        assert "gpukit-2: gpukit/guard-test/pending.bin is still waiting to be uploaded from the /mnt/s3 write " \
               "cache" in reasons, reasons
    finally:
        vm_exec(here(cluster_kit), "gpukit-2", "rm", "-rf", meta)
    assert not any("pending.bin" in r for r in down_guard.blockers(cluster_kit.home))


def test_a_live_run_blocks_resume_and_an_up_that_would_remove_its_vm(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    kit.glue("deploy", "--run", "live", "--config", str(run_config(tmp_path, config={"steps": 400, "step_sleep": 0.1})),
             "--vm", "gpukit-1")
    wait_for(fast, "live", lambda s: (s.get("step") or 0) >= 1, timeout=90)
    cluster_json = (kit.home / "cluster.json").read_text()
    try:
        res = kit.glue("deploy", "--run", "live", "--config", str(run_config(tmp_path)), "--resume", check=False)
        assert res.returncode == 1 and "run live is still running" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
        # Another name prefix would replace both VMs: the down guard's check, on the VMs about to go.
        res = kit.glue("up", "--name-prefix", "other", "--no-configure", check=False)
        assert res.returncode == 1 and "refusing to remove gpukit-1, gpukit-2: " in res.stderr, res.stderr
        assert "run live is still running on gpukit-1" in res.stderr  # among the other tests' runs
        assert "glue up --vms 2 --name-prefix gpukit" in res.stderr and "Traceback" not in res.stderr
        # Another backend would leave these VMs running where no command of this kit home looks.
        res = kit.glue("up", "--backend", "qemu", "--no-configure", check=False)
        assert res.returncode == 1 and "`glue down` first" in res.stderr, res.stderr
        assert (kit.home / "cluster.json").read_text() == cluster_json
        assert status(fast, "live")["state"] == "running" and status(fast, "live")["attempt"] == 1
        assert [v["name"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"]] == ["gpukit-1",
                                                                                                 "gpukit-2"]
        # Supervisor and trainer gone at once (as with a lost VM): no exit record will ever come, and
        # `glue logs -f` stops once the monitor no longer sees the attempt running.
        rec = json.loads(s3(fast).get_object(Bucket="gpukit", Key="runs/live/attempts/1.json")["Body"].read())
        vm_exec(fast, "gpukit-1", "kill", "-9", str(rec["supervisor_pid"]), str(rec["trainer_pid"]))
        res = kit.glue("logs", "--run", "live", "-f", timeout=120)
        assert "attempt 1 of run live is no longer running" in res.stderr, res.stderr
        assert "glue incidents --run live" in res.stderr
    finally:
        fast.glue("ssh", "gpukit-1", "--", "kill", "-9", str(trainer_pid(fast, "live")), check=False)


def test_stop_kills_the_trainer_on_its_vm_and_watchers_leave_the_run(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    kit.glue("deploy", "--run", "halt", "--config", str(run_config(tmp_path, config={"steps": 400, "step_sleep": 0.1})),
             "--vm", "gpukit-1")
    wait_for(fast, "halt", lambda s: (s.get("step") or 0) >= 1, timeout=90)
    pid = trainer_pid(fast, "halt")
    said = " ".join(kit.glue("stop", "--run", "halt").stderr.split())
    assert "run halt: attempt 1 stopped, its trainer killed" in said, said
    assert vm_exec(fast, "gpukit-1", "sh", "-c", f"kill -0 {pid} 2>/dev/null && echo alive || echo gone").split() == \
        ["gone"]
    st = status(fast, "halt")
    assert st["state"] == "killed" and "stopped on request (glue stop)" in st["reason"], st
    kit.glue("watch", "--once", "--run", "halt")
    assert status(fast, "halt")["attempt"] == 1  # not recovered
    # ended on purpose, its outputs never to come: `glue down` does not wait for them
    from glue.operations import down_guard

    assert not any("run halt" in r for r in down_guard.blockers(kit.home))
    res = kit.glue("stop", "--run", "no-such-run", check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_resume_of_a_completed_run_is_refused(cluster_kit: Kit, completed_run: str, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    assert completed_run == "done"  # the run named in the messages below
    cfg = run_config(tmp_path, config={"steps": 2, "step_sleep": 0})
    res = kit.glue("deploy", "--run", "done", "--config", str(cfg), "--resume", check=False)
    assert res.returncode == 1 and "run done completed; its outputs are final" in res.stderr, res.stderr
    assert status(fast, "done")["attempt"] == 1
    res = kit.glue("logs", "--run", "done", "--attempt", "2", check=False)
    assert res.returncode == 1 and "run done has no attempt 2; its attempts: 1" in res.stderr, res.stderr


def test_an_incident_counts_steps_past_the_last_heartbeat(cluster_kit: Kit, tmp_path: Path) -> None:
    """The heartbeat (and the metrics it flushes) comes every heartbeat_seconds; a checkpoint the trainer
    committed since then is a step the attempt completed, and the incident must not report less."""
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 2000, "step_sleep": 0.02, "checkpoint_interval": 10},
                     monitor={"heartbeat_seconds": 30, "stall_timeout_seconds": 120, "lost_after_seconds": 60})
    kit.glue("deploy", "--run", "lag", "--config", str(cfg), "--vm", "gpukit-2")
    commits: list[int] = []
    deadline = time.monotonic() + 60
    while len(commits) < 2 and time.monotonic() < deadline:
        commits = sorted(int(k.split("/step-")[1].split("/")[0]) for k in run_objects(fast, "lag")
                         if k.endswith("/COMMIT.json"))
        time.sleep(0.2)
    assert len(commits) >= 2, run_objects(fast, "lag")
    vm_exec(fast, "gpukit-2", "kill", "-9", str(trainer_pid(fast, "lag")))
    wait_for(fast, "lag", lambda s: s["state"] != "running", timeout=120)
    [inc] = json.loads(kit.glue("incidents", "--run", "lag", "--json").stdout)
    assert inc["last_valid_checkpoint"] >= commits[-1]
    assert inc["last_completed_step"] >= inc["last_valid_checkpoint"], inc


def test_a_stopped_bucket_server_starts_again_on_demand_while_vms_run(cluster_kit: Kit, completed_run: str) -> None:
    """README: the local bucket starts on demand (any command that reads the bucket), also while VMs are up
    and Terraform's outputs name its endpoint; on the same port, so the VMs' /mnt/s3 keeps working."""
    kit, fast = cluster_kit, here(cluster_kit)
    server = LocalBucket(kit.home)
    port = server.info().endpoint
    server.stop()
    assert not server.running()
    st = json.loads(kit.glue("status", "--run", completed_run, "--json").stdout)
    assert st["state"] == "completed", st
    assert server.running() and server.info().endpoint == port
    assert json.loads(kit.glue("status", "--json").stdout)["bucket"]["reachable"] is True
    assert "final.json" in vm_exec(fast, "gpukit-1", "ls", f"/mnt/s3/runs/{completed_run}/outputs")


# `stress` (make test-all): make test classes a stopped trainer a stall (test_sigstop_is_a_stall_with_stacks) and
# reads lost_after in the watcher's probe (tests/unit/test_watch_probe.py); this is one `--once` pass deciding it.
@pytest.mark.stress
def test_watch_once_finds_a_stopped_trainer_once_its_heartbeat_is_past_lost_after(cluster_kit: Kit,
                                                                                 tmp_path: Path) -> None:
    """docs/watch.md: once the heartbeat is older than lost_after_seconds, a trainer stopped on a VM that
    answers is a stall; a single `--once` pass (cron) decides it then, not only after stall_timeout_seconds."""
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 3000, "step_sleep": 0.1},
                     monitor={"heartbeat_seconds": 1, "lost_after_seconds": 5, "stall_timeout_seconds": 120},
                     recovery={"max_failures": 0})
    kit.glue("deploy", "--run", "once-stop", "--config", str(cfg), "--vm", "gpukit-2")
    wait_for(fast, "once-stop", lambda s: (s["step"] or 0) >= 3)
    pid = trainer_pid(fast, "once-stop")
    vm_exec(fast, "gpukit-2", "kill", "-STOP", str(pid))
    try:
        time.sleep(7)  # the heartbeat is now past lost_after_seconds (5), far from stall_timeout_seconds (120)
        kit.glue("watch", "--once", "--run", "once-stop", check=False)
        st = json.loads(s3(fast).get_object(Bucket="gpukit", Key="runs/once-stop/attempts/1.json")["Body"].read())
        assert st.get("failure_class") == "stall" and "state T" in st.get("reason", ""), st
    finally:
        vm_exec(fast, "gpukit-2", "kill", "-9", str(pid))


def test_an_attempt_whose_trainer_is_being_started_is_not_a_failure(cluster_kit: Kit, tmp_path: Path) -> None:
    """A deploy records the attempt a moment before its trainer starts. Meanwhile (its lease held by another
    process) status and watchers see it starting, not `killed`; once no one is starting it, it is judged."""
    from glue.runs import lease

    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 2, "step_sleep": 0})
    kit.glue("deploy", "--run", "starting", "--config", str(cfg), "--vm", "gpukit-1")
    first = wait_for(fast, "starting", lambda s: s["state"] != "running", timeout=90)
    assert first["state"] == "completed", first
    store = RunStore.open(kit.home, "starting")
    held = lease.acquire(store, "deploy")  # this test process plays the deploy that is starting attempt 2
    try:
        one = store.attempt(1)
        store.put_json("attempts/2.json", {**one, "attempt": 2, "outcome": None, "exit": None, "ended_at": None,
                                           "failure_class": None, "trainer_pid": None, "supervisor_pid": None,
                                           "nodes": [{k: v for k, v in nd.items() if not k.endswith("_pid")}
                                                     for nd in one["nodes"]]})
        st = status(kit, "starting")  # a `glue` process of its own: not the lease's holder
        assert st["state"] == "running" and st["reason"].startswith("starting: deploy ("), st
    finally:
        lease.release(store, held)
    st = status(kit, "starting")
    assert st["state"] == "killed" and "attempt 2 never started" in st["reason"], st


def test_a_bucket_that_stops_answering_under_a_live_trainer_is_storage_lost(cluster_kit: Kit, tmp_path: Path) -> None:
    """README's storage_lost: the S3 endpoint unreachable, the trainer's calls failing past retries. Its
    heartbeat cannot reach the bucket either, so without its own words (its log on the VM) it read as a stall."""
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 3000, "step_sleep": 0.1},
                     monitor={"heartbeat_seconds": 1, "stall_timeout_seconds": 10})
    kit.glue("deploy", "--run", "no-bucket", "--config", str(cfg), "--vm", "gpukit-1")
    wait_for(fast, "no-bucket", lambda s: (s["step"] or 0) >= 3)
    pid = trainer_pid(fast, "no-bucket")
    LocalBucket(kit.home).stop()
    try:
        time.sleep(14)  # past the stall timeout; the next glue command starts the bucket again
        st = status(kit, "no-bucket")
        assert st["state"] == "storage_lost", st
        assert "the trainer's calls to the bucket fail on gpukit-1" in st["reason"], st
        assert "Could not connect to the endpoint URL" in st["reason"], st
    finally:
        vm_exec(fast, "gpukit-1", "kill", "-9", str(pid))


def test_a_run_left_alone_by_a_watcher_of_every_run_is_taken_on_when_named(cluster_kit: Kit,
                                                                           completed_run: str) -> None:
    """docs/watch.md: watching every run, one whose latest attempt ended before any watcher saw it is left
    alone; `glue watch --run X` takes such a run on (also after a watcher of every run left it alone)."""
    from glue.watch.adopt import adopt
    from glue.watch.watch_state import WatchState

    kit = cluster_kit
    store = RunStore.open(kit.home, completed_run)
    assert WatchState.load(store) is None  # no watcher has seen it yet
    adopt(store, 1, named=False, say=print)  # what a watcher of every run does on first sight
    left = WatchState.load(store)
    assert left is not None and "before a watcher saw the run" in (left.stopped or ""), left
    kit.glue("watch", "--once", "--run", completed_run)
    st = WatchState.load(store)
    assert st is not None and st.done and not st.stopped, st
    assert [h["action"] for h in st.history][-2:] == ["watching", "completed"], st.history


@pytest.mark.timeout(600)
def test_a_watcher_whose_recovery_resumes_wrongly_stops_the_run_as_a_bad_restart(cluster_kit: Kit,
                                                                                 tmp_path: Path) -> None:
    """docs/watch.md: a resume that fails the check is a `bad_restart` and stops the run; it is not a failed
    recovery (no `recovery_failed`, no backoff and retry of a recovery that did happen). README: the
    checkpoints the wrong resume wrote are marked rejected, so no later resume starts from them."""
    from glue.runs import monitor
    from glue.train.checkpoint.format import REJECTED, list_steps
    from glue.watch.watch_state import WatchState

    kit, fast = cluster_kit, here(cluster_kit)
    # Attempt 1 holds after step 27 (as `glue drill` holds its victim): killed there, it leaves checkpoint 25
    # and two steps past it to compare, every time. The wrong resume from 25 commits checkpoint 30 and
    # later ones before the check stops it (keep_last: none of them prunes 25 away).
    cfg = run_config(tmp_path, config={"steps": 80, "step_sleep": 0.1, "broken_resume": "skip_rng"},
                     checkpoint={"interval_steps": 5, "keep_last": 30}, monitor={"heartbeat_seconds": 0.5},
                     env={"OMP_NUM_THREADS": "1", "GPUKIT_HOLD_AT": "1:27"})
    stop_live_runs(fast)  # its recovery replaces gpukit-2: no other test's trainer may live there
    kit.glue("deploy", "--run", "wbad", "--config", str(cfg), "--vm", "gpukit-2")
    wait_for(fast, "wbad", lambda s: (s["step"] or 0) >= 27)
    rec = RunStore.open(kit.home, "wbad").attempt(1)
    vm_exec(fast, "gpukit-2", "kill", "-9", str(rec["supervisor_pid"]), str(rec["trainer_pid"]))
    wait_for(fast, "wbad", lambda s: s["state"] == "killed", timeout=60)
    kit.glue("watch", "--once", "--run", "wbad", check=False, timeout=600)
    st = WatchState.load(RunStore.open(kit.home, "wbad"))
    assert st is not None and st.stopped and "bad_restart" in st.stopped, st
    actions = [h["action"] for h in st.history]
    assert actions[-3:] == ["recovering", "resume_check_failed", "stopped"], actions
    assert "recovery_failed" not in actions and status(fast, "wbad")["state"] == "bad_restart"
    store = RunStore.open(kit.home, "wbad")
    ckpt = st.history[-2]["checkpoint_step"]
    assert ckpt == 25 and st.history[-2]["failure_step"] == 27, st.history[-2]
    storage = monitor.checkpoint_storage(store, store.read_manifest())
    assert storage is not None
    after = {s: objs for s, objs in list_steps(storage).items() if s > ckpt}
    rejected = st.history[-2]["rejected_checkpoints"]
    committed = sorted(s for s, objs in after.items() if "COMMIT.json" in objs)
    assert rejected and rejected == committed, (rejected, after)
    assert all(REJECTED in after[s] for s in committed)
    assert monitor.last_valid_checkpoint(store, store.read_manifest()) == ckpt  # the good trajectory's


def test_a_watcher_killed_after_recording_the_new_attempt_is_retried_on_its_budget(cluster_kit: Kit,
                                                                                  tmp_path: Path) -> None:
    """docs/watch.md: a watcher killed mid-recovery before the new attempt started leaves a retry to the next
    watcher, on the budget already spent; also when it had recorded the new attempt but not its trainer."""
    from glue.watch.watch_state import WatchState

    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 60, "step_sleep": 0.1, "checkpoint_interval": 10},
                     checkpoint={"interval_steps": 10}, monitor={"heartbeat_seconds": 0.5})
    stop_live_runs(fast)  # its recovery replaces gpukit-2: no other test's trainer may live there
    kit.glue("deploy", "--run", "wint", "--config", str(cfg), "--vm", "gpukit-2")
    wait_for(fast, "wint", lambda s: (s["step"] or 0) >= 15)
    store = RunStore.open(kit.home, "wint")
    one = store.attempt(1)
    vm_exec(fast, "gpukit-2", "kill", "-9", str(one["supervisor_pid"]), str(one["trainer_pid"]))
    wait_for(fast, "wint", lambda s: s["state"] == "killed", timeout=60)
    # What a watcher leaves when SIGKILLed inside `glue recover`, between recording attempt 2 and starting
    # its trainer: the failure counted, the recovery noted, attempt 2 recorded without a trainer.
    dead = WatchState("wint", adopted_attempt=1, used={"failures": 1}, handled_attempt=1)
    dead.note("recovering", attempt=1, outcome="killed", budget="failures")
    dead.save(store)
    one = store.attempt(1)
    store.put_json("attempts/2.json", {**one, "attempt": 2, "outcome": None, "exit": None, "ended_at": None,
                                       "failure_class": None, "reason": None, "incident": None,
                                       "trainer_pid": None, "supervisor_pid": None,
                                       "nodes": [{k: v for k, v in nd.items() if not k.endswith("_pid")}
                                                 for nd in one["nodes"]]})
    out = kit.glue("watch", "--once", "--run", "wint", check=False, timeout=600)
    st = WatchState.load(store)
    assert st is not None, out.stdout
    actions = [h["action"] for h in st.history]
    assert actions[:4] == ["recovering", "recovery_interrupted", "recovering", "recovered"], (actions, out.stdout)
    assert st.used == {"failures": 1}, st.used  # a retry of the interrupted recovery, not a new failure
    assert "never started" in str(store.attempt(2).get("reason")), store.attempt(2)
    rec = store.get_json("recoveries/1.json")
    assert rec is not None and rec["verified"] and rec["failed_attempt"] == 2 and rec["new_attempt"] == 3, rec
    # Following an attempt that has ended ends at once, with that attempt's own class (not the latest's).
    t0 = time.monotonic()
    followed = kit.glue("logs", "--run", "wint", "-f", "--attempt", "1", timeout=60)
    assert time.monotonic() - t0 < 10 and "attempt 1 of run wint is no longer running (killed" in followed.stderr, \
        followed.stderr


# `stress` (make test-all): make test decides a wait for capacity without budget or tries
# (tests/unit/test_watch_policy.py::test_waiting_for_capacity_spends_no_budget_and_no_try_but_the_deadline_holds)
# and recovers a lost VM unattended (tests/e2e/test_watch.py::test_watch_recovers_unattended_within_budgets).
@pytest.mark.stress
def test_a_recovery_without_capacity_is_waited_out_not_counted(cluster_kit: Kit, tmp_path: Path) -> None:
    """A lost VM the cloud cannot replace yet (no capacity; GPUKIT_LOCAL_CAPACITY here, Lyceum's HTTP 500
    live): `glue watch` waits with backoff and asks again, more often than it would retry a failed recovery,
    without spending budget or counting failed recoveries; once a VM can be had, the run is recovered."""
    from glue.cloud.local.backend import LocalBackend
    from glue.watch.policy import MAX_TRIES
    from glue.watch.watch_state import WatchState

    kit, fast = cluster_kit, here(cluster_kit)
    cfg = run_config(tmp_path, config={"steps": 60, "step_sleep": 0.1, "checkpoint_interval": 10},
                     checkpoint={"interval_steps": 10},
                     recovery={"max_preemptions": 1, "backoff_seconds": 1, "backoff_max_seconds": 1})
    kit.glue("deploy", "--run", "wcap", "--config", str(cfg), "--vm", "gpukit-2")
    wait_for(fast, "wcap", lambda s: (s["step"] or 0) >= 15)
    store = RunStore.open(kit.home, "wcap")
    LocalBackend(kit.home).delete_vm(str(store.attempt(1)["vm_id"]))
    wait_for(fast, "wcap", lambda s: s["state"] == "vm_lost", timeout=60)
    full = {**kit.env, "GPUKIT_LOCAL_CAPACITY": "1"}  # gpukit-1 is left: no VM can be made
    for n in range(1, MAX_TRIES + 2):
        st = WatchState.load(store)
        while st is not None and st.next_try_at > time.time():  # the backoff (1 s)
            time.sleep(0.2)
        out = kit.glue("watch", "--once", "--run", "wcap", env=full, check=False, timeout=300)
        st = WatchState.load(store)
        assert st is not None and st.capacity_waits == n, (out.stdout, out.stderr)
        assert st.failed_in_row == 0 and st.used["preemptions"] == 1 and st.stopped is None, st
    said = " ".join((out.stdout + out.stderr).split())
    assert "no capacity to recover attempt 1" in said and "not counted as a failed recovery" in said, said
    while st.next_try_at > time.time():
        time.sleep(0.2)
    kit.glue("watch", "--once", "--run", "wcap", timeout=600)  # a VM can be had again
    st = WatchState.load(store)
    assert st is not None and st.last is not None and st.last["action"] == "recovered", st.history[-3:]
    assert st.capacity_waits == 0 and st.used["preemptions"] == 1
    rec = store.get_json("recoveries/1.json")
    assert rec is not None and rec["verified"], rec
    kit.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)

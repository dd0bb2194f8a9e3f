"""Your own job: the example user project (examples/my_project: train.py, a local package, requirements)
deployed from a temporary copy; its VM destroyed mid-run and `glue recover` verifies the resume (the new VM
unpacks the environment the first deploy packed, with exactly the manifest's pins). Then
the copy is edited and deleted, the index its requirement came from is gone, and a forced second
recovery still runs the deployed code with the deployed requirements, both from the bucket."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from glue.cloud.local.backend import LocalBackend
from glue.storage import bucket as bucket_store
from glue.train import layout
from glue.train.workspace import pins
from tests.integration.test_runs import ROOT, SMALL_MODEL, here, s3, status, wait_for
from tests.wheels import make_wheel

from .conftest import Kit

pytestmark = pytest.mark.e2e
# The venv's own distributions, read by its python on the VM (importlib.metadata, its site-packages only).
INSTALLED = ("import importlib.metadata as m, json, sysconfig; "
             "print(json.dumps([d.metadata['Name'] + '==' + d.version "
             "for d in m.distributions(path=[sysconfig.get_paths()['purelib']])]))")
PROBE = "print('probe dependency:', __import__('gpukit_probe_dep').VALUE, flush=True)\n"


def project(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the example project whose trainer also imports a dependency only a test-built wheel holds."""
    proj, index = tmp_path / "my_project", tmp_path / "index"
    shutil.copytree(ROOT / "examples" / "my_project", proj)
    make_wheel(index, "gpukit-probe-dep", "0.1", "gpukit_probe_dep", "VALUE = 'from-the-wheelhouse'\n")
    reqs = (proj / "requirements.txt").read_text()
    (proj / "requirements.txt").write_text(f"{reqs}--find-links {index}\ngpukit-probe-dep==0.1\n")
    train = (proj / "train.py").read_text()
    (proj / "train.py").write_text(train.replace("\n\ndef main", f"\n{PROBE}\n\ndef main", 1))
    cfg = yaml.safe_load((proj / "run.yaml").read_text())
    cfg["config"].update(steps=400, step_sleep=0.1)
    (proj / "run.yaml").write_text(yaml.safe_dump(cfg))
    return proj, index


def bucket_json(client: object, key: str) -> dict:
    data = bucket_store.read_json(client, "gpukit", key)
    assert data is not None, f"{key} is not in the bucket"
    return dict(data)


@pytest.mark.timeout(900)
def test_own_project_recovers_from_the_bucket_after_the_local_copy_is_gone(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    proj, index = project(tmp_path)
    out = kit.glue("deploy", "--run", "own", "--config", str(proj / "run.yaml"), "--vm", "gpukit-2")
    assert "requirements: 2 pinned" in out.stderr and "wheelhouse uploaded" in out.stderr, out.stderr
    manifest = bucket_json(client, layout.run_prefix("own") + layout.MANIFEST)
    code, req = manifest["workdir"], manifest["requirements"]
    assert code["files"] == 7 and code["command_in_package"] and code["key"] == layout.code_key(code["sha256"])
    assert req["pins"] == ["einops==0.8.1", "gpukit-probe-dep==0.1"] and "torch" not in json.dumps(req["wheels"])
    # A second deploy of the same tree uploads nothing (content address), and says so.
    again = kit.glue("deploy", "--run", "own-again", "--config", str(proj / "run.yaml"), "--vm", "gpukit-1")
    assert "already in the bucket" in again.stderr and "wheelhouse already in the bucket" in again.stderr
    assert bucket_json(client, layout.run_prefix("own-again") + layout.MANIFEST)["workdir"]["sha256"] == code["sha256"]
    first_key = layout.run_prefix("own-again") + layout.attempt_key(1)
    fast.glue("ssh", "gpukit-1", "--", "kill", "-9", str(bucket_json(client, first_key)
                                                         ["trainer_pid"]))
    try:
        wait_for(fast, "own", lambda s: (s["step"] or 0) >= 25)
        vm = next(v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"] if v["name"] == "gpukit-2")
        LocalBackend(kit.home).delete_vm(vm)
        shutil.rmtree(index)  # the requirement's only index is gone: recoveries install from the bucket
        res = kit.glue("recover", "--run", "own", timeout=600)
        assert "resume verified" in res.stderr, res.stderr
        # The new VM booted the baked image with the cluster's seed (unchanged configuration): no playbook; it
        # unpacked the environment the first deploy packed, which holds exactly the manifest's pins.
        said = " ".join(res.stderr.split())
        assert "gpukit-2: configured itself at first boot from the cluster's seed" in said, said
        assert "gpukit-2: environment: unpacked the set's packed virtualenv" in said, said
        python = f"/var/lib/gpukit/work/own/venv-{req['set_sha256'][:16]}/bin/python"
        got = json.loads(fast.glue("ssh", "gpukit-2", "--", python, "-c", INSTALLED).stdout.strip().splitlines()[-1])
        assert pins.as_dict(got) == pins.as_dict(req["pins"])  # no more, no less
        assert "converging" not in said and "ansible site.yml" not in said, said
        rec = bucket_json(client, layout.run_prefix("own") + layout.recovery_key(1))
        assert rec["verified"] and "prepare" in rec["seconds"]
        if rec["failure_step"] > rec["checkpoint_step"]:  # the VM can die right at a checkpoint: nothing to replay
            assert rec["compared_steps"][0] == rec["checkpoint_step"] + 1
        second = bucket_json(client, layout.run_prefix("own") + layout.attempt_key(2))
        assert second["code_sha256"] == code["sha256"] and second["requirements_set"] == req["set_sha256"]

        # The user edits and then deletes their folder: the run still runs what was deployed.
        (proj / "train.py").write_text("raise SystemExit('the edited trainer must never run')\n")
        shutil.rmtree(proj)
        fast.glue("ssh", "gpukit-2", "--", "kill", "-9", str(second["trainer_pid"]))
        wait_for(fast, "own", lambda s: s["state"] != "running")
        res = kit.glue("recover", "--run", "own", "--force", "--same-vm", timeout=600)
        assert "resume verified" in res.stderr, res.stderr
        # The first recovery recorded gpukit-2 configured: restarting the run there needs no playbook.
        said = " ".join(res.stderr.split())  # rich wraps long lines
        assert "gpukit-2 is unchanged since it was converged and its mount is live: no playbook" in said, said
        third = bucket_json(client, layout.run_prefix("own") + layout.attempt_key(3))
        assert third["code_sha256"] == code["sha256"] and third["requirements_set"] == req["set_sha256"]
        log = kit.glue("logs", "--run", "own", "--attempt", "3").stdout
        assert "probe dependency: from-the-wheelhouse" in log and "edited" not in log
        assert status(fast, "own")["state"] in ("running", "completed")
    finally:
        fast.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)


# `stress` (make test-all, since 2026-12-06: the suite's time): make test refuses a changed or missing package
# before anything is unpacked (tests/unit/test_workspace_vm.py), on the VM's prepare code; this adds the
# recovery around it on a live VM.
@pytest.mark.stress
def test_a_changed_package_in_the_bucket_is_refused_before_an_attempt_starts(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    work = tmp_path / "work"
    work.mkdir()
    (work / "NOTES.md").write_text(f"unique to {tmp_path}\n")
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_gpt.yaml").read_text())
    cfg["config"].update(steps=400, step_sleep=0.05, **SMALL_MODEL)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**cfg, "workdir": str(work)}))
    kit.glue("deploy", "--run", "tampered", "--config", str(tmp_path / "run.yaml"), "--vm", "gpukit-1")
    try:
        st = wait_for(fast, "tampered", lambda s: (s["step"] or 0) >= 21)
        sha = bucket_json(client, layout.run_prefix("tampered") + layout.MANIFEST)["workdir"]["sha256"]
        client.put_object(Bucket="gpukit", Key=layout.code_key(sha), Body=b"not the package")
        pid = bucket_json(client, layout.run_prefix("tampered") + layout.attempt_key(1))["trainer_pid"]
        fast.glue("ssh", "gpukit-1", "--", "kill", "-9", str(pid))
        wait_for(fast, "tampered", lambda s: s["state"] != "running")
        res = kit.glue("recover", "--run", "tampered", "--same-vm", check=False, timeout=600)
        assert res.returncode != 0 and f"not the manifest's {sha}" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and "not the manifest's" in res.stderr.strip().splitlines()[-1]
        second = layout.run_prefix("tampered") + layout.attempt_key(2)
        assert bucket_store.read_json(client, "gpukit", second) is None  # nothing started
        assert st["attempt"] == 1
    finally:
        fast.glue("ssh", "gpukit-1", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)

"""A run with requirements on local VMs: its first deploy installs the set from the wheelhouse and packs the
virtualenv into the bucket; its recovery onto a new VM unpacks that pack, and the environment there holds
exactly the manifest's pins; a pack changed in the bucket is refused in one line before the attempt is
recorded (glue.train.workspace.environment)."""

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
from tests.integration.test_runs import ROOT, here, s3, wait_for
from tests.wheels import make_wheel

from .conftest import Kit

pytestmark = pytest.mark.integration
DEP = "gpukit-envpack-dep"
# The venv's own distributions, read by its python on the VM (importlib.metadata, its site-packages only).
INSTALLED = ("import importlib.metadata as m, json, sysconfig; "
             "print(json.dumps([d.metadata['Name'] + '==' + d.version "
             "for d in m.distributions(path=[sysconfig.get_paths()['purelib']])]))")


def project(tmp_path: Path) -> Path:
    """tiny_gpt from a workdir whose requirements hold one test-built wheel."""
    work, index = tmp_path / "work", tmp_path / "index"
    make_wheel(index, DEP, "0.1", "gpukit_envpack_dep", "VALUE = 'from-the-pack'\n")
    work.mkdir()
    (work / "requirements.txt").write_text(f"--find-links {index}\n{DEP}==0.1\n")
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_gpt.yaml").read_text())
    cfg["config"].update(steps=400, step_sleep=0.05)
    cfg.update(workdir=str(work), requirements="requirements.txt")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "run.yaml"


def record(client: object, run: str, key: str) -> dict | None:
    return bucket_store.read_json(client, "gpukit", layout.run_prefix(run) + key)


# `stress` (make test-all, since 2026-12-07): make test has the recovery onto a new VM that unpacks the set's pack
# with the manifest's pins (tests/e2e/test_own_job.py) and a changed pack refused (tests/unit/test_workspace_pack.py).
@pytest.mark.stress
@pytest.mark.timeout(600)
def test_a_recovery_on_a_new_vm_unpacks_the_sets_pack_and_a_changed_pack_is_refused(
        cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    client = s3(fast)
    cfg = project(tmp_path)
    out = kit.glue("deploy", "--run", "envpack", "--config", str(cfg), "--vm", "gpukit-2")
    said = " ".join(out.stderr.split())
    assert "gpukit-2: environment: no VM has packed this dependency set yet: installed 1 pinned packages from the " \
           "wheelhouse, and packed it for the next VM" in said, said
    req = dict(record(client, "envpack", layout.MANIFEST)["requirements"])  # type: ignore[index]
    index = bucket_store.read_json(client, "gpukit", layout.env_pack_index_key(req["set_sha256"]))
    assert index is not None and index["prefix"] == f"/var/lib/gpukit/envs/{req['set_sha256'][:16]}"
    try:
        wait_for(fast, "envpack", lambda s: (s["step"] or 0) >= 21)
        vm = next(v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"] if v["name"] == "gpukit-2")
        LocalBackend(kit.home).delete_vm(vm)
        shutil.rmtree(tmp_path / "index")  # no wheel outside the bucket
        res = kit.glue("recover", "--run", "envpack", timeout=600)
        said = " ".join(res.stderr.split())
        assert "resume verified" in said and "gpukit-2: environment: unpacked the set's packed virtualenv" in said, said
        second = record(client, "envpack", layout.attempt_key(2))
        assert second is not None and second["requirements_set"] == req["set_sha256"]
        python = f"/var/lib/gpukit/work/envpack/venv-{req['set_sha256'][:16]}/bin/python"
        got = json.loads(fast.glue("ssh", "gpukit-2", "--", python, "-c", INSTALLED).stdout.strip().splitlines()[-1])
        assert pins.as_dict(got) == pins.as_dict(req["pins"])  # the manifest's pins, no more, no less

        # The pack changed in the bucket; the VM's environment gone (as on a new VM): refused, nothing started.
        client.put_object(Bucket="gpukit", Key=index["key"], Body=b"not the packed environment")
        fast.glue("ssh", "gpukit-2", "--", "kill", "-9", str(second["trainer_pid"]))
        wait_for(fast, "envpack", lambda s: s["state"] != "running")
        env = f"/var/lib/gpukit/envs/{req['set_sha256'][:16]}"
        fast.glue("ssh", "gpukit-2", "--", "rm", "-rf", env, f"/dev/shm/gpukit-envs/{req['set_sha256'][:16]}")
        res = kit.glue("recover", "--run", "envpack", "--same-vm", check=False, timeout=600)
        last = res.stderr.strip().splitlines()[-1]
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert "it was changed in the bucket" in last and index["sha256"] in " ".join(res.stderr.split()), res.stderr
        assert record(client, "envpack", layout.attempt_key(3)) is None  # refused before the attempt was recorded
    finally:
        fast.glue("ssh", "gpukit-2", "--", "pkill", "-9", "-f", "glue.train.run.supervise", check=False)

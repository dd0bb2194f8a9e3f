"""Your own bucket on VMs (a `stress` test: a VM of its own, minutes; `make test-all`): `glue up` with
--bucket-endpoint and --bucket mounts that bucket at /mnt/s3 on the VM (a file written there lands in it),
`glue status` shows it, a run's records and checkpoints land in it, its secret is only in the 0600 files
the VMs' mount is made from (never in terraform's state, the inventory, the cluster config or a log), and
`glue down` leaves its data."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import boto3
import pytest

from glue.bucket_access import BucketCredentials
from glue.train import layout
from tests.integration.test_own_bucket import serve
from tests.integration.test_runs import run_config
from tests.kit import Kit

pytestmark = [pytest.mark.integration, pytest.mark.stress]
SECRETS_ALLOWED = ("bucket/credentials.json", "seeds/current.tar.gz")  # both 0600


def test_vms_mount_your_bucket(kit: Kit, tmp_path: Path) -> None:
    creds = BucketCredentials(access_key="teamkey" + os.urandom(4).hex(), secret_key="teamsecret" + os.urandom(8).hex())
    (tmp_path / "s3" / "team-bucket").mkdir(parents=True)
    env = {**{k: v for k, v in kit.env.items() if not k.startswith("AWS_")},
           "AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key,
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
    with serve(tmp_path / "s3", creds) as endpoint:
        up = kit.glue("up", "--vms", "1", "--bucket-endpoint", endpoint, "--bucket", "team-bucket", env=env,
                      timeout=600)
        assert f"bucket: ✓ s3://team-bucket at {endpoint}" in up.stderr
        kit.glue("ssh", "gpukit-1", "--", "sh", "-c", "echo from-the-vm > /mnt/s3/hello.txt", env=env)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=creds.access_key,
                          aws_secret_access_key=creds.secret_key, region_name="us-east-1")
        deadline = time.monotonic() + 30
        while "hello.txt" not in [o["Key"] for o in s3.list_objects_v2(Bucket="team-bucket").get("Contents", [])]:
            assert time.monotonic() < deadline, "the VM's /mnt/s3 write never reached your bucket"
            time.sleep(0.5)
        assert s3.get_object(Bucket="team-bucket", Key="hello.txt")["Body"].read() == b"from-the-vm\n"
        status = json.loads(kit.glue("status", "--json", env=env).stdout)["bucket"]
        assert (status["name"], status["endpoint"], status["reachable"]) == ("team-bucket", endpoint, True)
        # The local backend's VM disks live in the kit home too (vms/): the VM's own 0600 rclone.conf is there.
        holding = sorted(str(p.relative_to(kit.home)) for p in kit.home.rglob("*")
                         if p.is_file() and not p.relative_to(kit.home).parts[0] == "vms"
                         and creds.secret_key.encode() in p.read_bytes())
        assert set(holding) <= set(SECRETS_ALLOWED) and "bucket/credentials.json" in holding, holding
        assert all((kit.home / p).stat().st_mode & 0o777 == 0o600 for p in holding)
        assert creds.secret_key not in up.stdout + up.stderr
        # Another bucket under live VMs is refused: their runs' records are in this one.
        back = kit.glue("up", "--kit-bucket", env=env, check=False)
        assert back.returncode == 1 and back.stderr.strip().splitlines() == [
            f"Error: this cluster's 1 VM(s) use s3://team-bucket at {endpoint}, and their runs' records are there: "
            "`glue down` first, then `glue up` with the backend's own bucket"], back.stderr
        # A run's records and checkpoints go to your bucket.
        kit.glue("deploy", "--run", "mine", "--config", str(run_config(tmp_path, config={"steps": 10})), env=env)
        deadline = time.monotonic() + 180
        while (st := json.loads(kit.glue("status", "--run", "mine", "--json", env=env).stdout))["state"] == "running":
            assert time.monotonic() < deadline, st
            time.sleep(1)
        assert st["state"] == "completed", st
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="team-bucket", Prefix=layout.run_prefix("mine"))
                .get("Contents", [])]
        assert any(k.startswith(layout.run_prefix("mine") + layout.CKPT_PREFIX) for k in keys), keys
        kit.glue("down", env=env)
        assert (tmp_path / "s3" / "team-bucket" / "hello.txt").read_text() == "from-the-vm\n"  # the data stays

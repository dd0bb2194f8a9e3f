"""Your own bucket (docs/guides/own-bucket.md), against real S3 servers on 127.0.0.1: the session's
`rclone serve s3` and a second server over the same folder with `--read-only` (a bucket that refuses
writes). No VM: `glue doctor`'s probe of a bucket named on the command line, credentials from the
environment or an AWS profile (boto3's own chain), and `glue up` refusing a bucket that fails the probe
before it touches a host, terraform or the kit home."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from glue.bucket_access import BucketCredentials, BucketInfo, own
from glue.cloud.local.bucket import free_port, port_answers
from glue.errors import GlueError
from glue.operations import bucket_checks
from glue.paths import minimal_env, tool
from glue.train import layout
from tests.conftest import BucketHandle
from tests.kit import Kit

pytestmark = pytest.mark.integration


@contextmanager
def serve(folder: Path, creds: BucketCredentials, *extra: str) -> Iterator[str]:
    """`rclone serve s3` over `folder` (its subfolders are the buckets) on loopback: its endpoint."""
    port = free_port()
    env = minimal_env(RCLONE_AUTH_KEY=f'"{creds.access_key},{creds.secret_key}"', RCLONE_CONFIG="/dev/null")
    proc = subprocess.Popen([tool("rclone"), "serve", "s3", str(folder), *extra, "--addr", f"127.0.0.1:{port}"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not port_answers(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def read_only(local_bucket: BucketHandle) -> Iterator[str]:
    """The session bucket's folder served again, read-only, with the same keys: its endpoint."""
    with serve(local_bucket.server.data, local_bucket.creds, "--read-only") as endpoint:
        yield endpoint


def user_env(kit: Kit, tmp_path: Path, bucket: BucketHandle | None, **extra: str) -> dict[str, str]:
    """The kit's environment with no AWS settings of the machine's own: the keys in the environment (when
    `bucket`), and credentials/config files of the test's own (empty unless written)."""
    env = {k: v for k, v in kit.env.items() if not k.startswith("AWS_")}
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "aws-credentials")
    env["AWS_CONFIG_FILE"] = str(tmp_path / "aws-config")
    if bucket is not None:
        env["AWS_ACCESS_KEY_ID"] = bucket.creds.access_key
        env["AWS_SECRET_ACCESS_KEY"] = bucket.creds.secret_key
    return {**env, **extra}


def probe_line(kit: Kit, env: dict[str, str], *args: str) -> tuple[dict[str, object], str]:
    res = kit.glue("doctor", "--backend", "ssh", "--json", *args, env=env, check=False)
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    return checks["bucket probe"], res.stdout + res.stderr


def doctor_keys(bucket: BucketHandle) -> list[str]:
    listing = bucket.client().list_objects_v2(Bucket=bucket.info.name, Prefix=layout.DOCTOR_PREFIX)
    return [o["Key"] for o in listing.get("Contents", [])]


def test_doctor_checks_your_bucket(kit: Kit, tmp_path: Path, local_bucket: BucketHandle) -> None:
    """Every step gpukit relies on is tried and named; the keys come from the environment and are never
    printed; nothing is left in the bucket or written to the kit home."""
    env = user_env(kit, tmp_path, local_bucket)
    check, out = probe_line(kit, env, "--bucket-endpoint", local_bucket.info.endpoint, "--bucket", "gpukit")
    assert check["ok"], check
    detail = str(check["detail"])
    for step in ("wrote", "read back", "listed", "ranged GET (bytes 5-20, Content-Range checked)",
                 "deleted (a GET then 404s)", "not versioned"):
        assert step in detail, detail
    assert f"s3://gpukit at {local_bucket.info.endpoint}" in detail
    assert local_bucket.creds.secret_key not in out
    assert doctor_keys(local_bucket) == []
    assert not (kit.home / "bucket").exists()  # doctor configures nothing


def test_credentials_from_the_environment_or_a_profile(tmp_path: Path, local_bucket: BucketHandle,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's chain: the environment's keys; a profile of the credentials file (--bucket-profile, or
    AWS_PROFILE); a profile that is not there, or no credentials at all, is one line."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    (tmp_path / "aws-credentials").write_text(
        f"[team]\naws_access_key_id = {local_bucket.creds.access_key}\n"
        f"aws_secret_access_key = {local_bucket.creds.secret_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    bucket = own.OwnBucket(endpoint=local_bucket.info.endpoint, name="gpukit")
    assert own.resolve(bucket) is None  # `glue up` then says so in one line (test_up_without_credentials_...)
    creds = own.resolve(bucket.model_copy(update={"profile": "team"}))
    assert creds is not None and bucket_checks.probe(bucket.info, creds).ok
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert own.resolve(bucket) == creds
    monkeypatch.delenv("AWS_PROFILE")
    with pytest.raises(GlueError, match=r"profile \(nobody\) could not be found; fix the AWS profile"):
        own.resolve(bucket.model_copy(update={"profile": "nobody"}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", local_bucket.creds.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", local_bucket.creds.secret_key)
    assert own.resolve(bucket) == creds


@pytest.mark.parametrize(("case", "args", "needle"), [
    ("no scheme", ["--bucket-endpoint", "s3.amazonaws.com", "--bucket", "gpukit"],
     "bucket endpoint: 's3.amazonaws.com' is not an S3 endpoint URL"),
    ("bad name", ["--bucket-endpoint", "http://127.0.0.1:9", "--bucket", "s3://My_Bucket"],
     "bucket name: 's3://My_Bucket' is not a bucket name"),
    ("region alone", ["--bucket-region", "eu-central-1"],
     "needs both --bucket-endpoint URL and --bucket NAME"),
])
def test_bad_bucket_options_are_one_line(kit: Kit, tmp_path: Path, case: str, args: list[str], needle: str) -> None:
    for command in (["doctor", "--backend", "ssh"], ["up", "--backend", "ssh", "--hosts", str(tmp_path / "h.yaml")]):
        res = kit.glue(*command, *args, env=user_env(kit, tmp_path, None), check=False)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert needle in res.stderr, (case, res.stderr)
        assert len(res.stderr.strip().splitlines()) <= 3, res.stderr  # click's usage lines at most
    assert list(kit.home.iterdir()) == []


def test_probe_names_each_refusal(local_bucket: BucketHandle, read_only: str) -> None:
    """A read-only bucket, a wrong secret, a missing bucket, an endpoint that does not answer: the bucket,
    the step and the fix, each on its one line; nothing left behind."""
    creds = local_bucket.creds
    cases = [
        (BucketInfo(read_only, "gpukit", ""), creds, "write of", "refused (InternalError, HTTP 500", "s3:PutObject"),
        (local_bucket.info, BucketCredentials(creds.access_key, "wrong"), "write of",
         "the endpoint rejects the secret key's signature (SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"),
        (BucketInfo(local_bucket.info.endpoint, "nowhere", ""), creds, "write of",
         "there is no such bucket at this endpoint (NoSuchBucket", "create the bucket"),
        (BucketInfo(f"http://127.0.0.1:{free_port()}", "gpukit", ""), creds, "write of",
         "the endpoint does not answer", "check --bucket-endpoint"),
    ]
    for info, given, step, what, fix in cases:
        check = bucket_checks.probe(info, given)
        assert not check.ok and check.name == "bucket probe"
        assert check.detail.startswith(f"s3://{info.name} at {info.endpoint}: {step} {layout.DOCTOR_PREFIX}")
        assert what in check.detail and fix in check.fix, check
        assert "\n" not in check.detail and creds.secret_key not in check.detail
    assert doctor_keys(local_bucket) == []


def test_versioning_is_reported() -> None:
    """How the kit treats a versioned bucket (no versioned server runs here: the note itself)."""
    assert "not versioned" in bucket_checks._versioning_note("")
    enabled = bucket_checks._versioning_note("Enabled")
    assert "delete marker" in enabled and "lifecycle rule expires noncurrent versions" in enabled
    assert "GetBucketVersioning refused" in bucket_checks._versioning_note("?")


def test_up_refuses_a_bucket_that_refuses_a_write(kit: Kit, tmp_path: Path, local_bucket: BucketHandle,
                                                  read_only: str) -> None:
    """One line naming the bucket, the step and the fix; nothing configured: no host contacted, no kit home
    file (no cluster config, no bucket record, no credentials copy), no terraform."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  - address: 127.0.0.1\n    port: {free_port()}\n    user: root\n"
                     f"    identity_file: {tmp_path / 'id'}\n")
    (tmp_path / "id").write_text("not used\n")
    res = kit.glue("up", "--backend", "ssh", "--hosts", str(hosts), "--vms", "1", "--accept-new-host-keys",
                   "--bucket-endpoint", read_only, "--bucket", "gpukit", env=user_env(kit, tmp_path, local_bucket),
                   check=False)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"Error: s3://gpukit at {read_only}: write of {layout.DOCTOR_PREFIX}"), lines
    assert "fix: give the credentials write access (s3:PutObject)" in lines[0] and "Nothing was configured" in lines[0]
    assert local_bucket.creds.secret_key not in res.stderr + res.stdout
    assert list(kit.home.iterdir()) == [], list(kit.home.rglob("*"))


def test_up_without_credentials_is_one_line(kit: Kit, tmp_path: Path, local_bucket: BucketHandle) -> None:
    res = kit.glue("up", "--backend", "ssh", "--hosts", str(tmp_path / "hosts.yaml"), "--bucket-endpoint",
                   local_bucket.info.endpoint, "--bucket", "gpukit", env=user_env(kit, tmp_path, None), check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"Error: no credentials for s3://gpukit at {local_bucket.info.endpoint} in the environment or an AWS "
        "profile: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or name a profile "
        "with --bucket-profile or AWS_PROFILE"]
    assert list(kit.home.iterdir()) == []


def test_the_bucket_is_kept_without_its_secret(kit: Kit, tmp_path: Path, local_bucket: BucketHandle,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket that passes is the kit home's once the other checks pass too: here the hosts file is missing,
    so nothing is adopted; the record `glue up` would write holds no secret (checked through the module)."""
    from glue.cloud import get_backend, own_bucket

    res = kit.glue("up", "--backend", "ssh", "--hosts", str(tmp_path / "missing.yaml"), "--bucket-endpoint",
                   local_bucket.info.endpoint, "--bucket", "gpukit", env=user_env(kit, tmp_path, local_bucket),
                   check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert f"bucket: ✓ s3://gpukit at {local_bucket.info.endpoint}" in res.stderr
    assert not (kit.home / "bucket").exists() and not (kit.home / "cluster.json").exists()
    # What the kit home holds once adopted: the record without secrets, the VMs' copy 0600; every command's
    # backend then serves this bucket.
    mine = own.OwnBucket(endpoint=local_bucket.info.endpoint, name="gpukit")
    own_bucket.adopt(kit.home, mine, local_bucket.creds)
    record = own.record_path(kit.home).read_text()
    assert local_bucket.creds.secret_key not in record and local_bucket.creds.access_key not in record
    copy = own_bucket.credentials_path(kit.home)
    assert copy.stat().st_mode & 0o777 == 0o600
    backend = get_backend("ssh", kit.home)
    assert backend.bucket() == mine.info and not backend.bucket_on_host
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    # No credentials in the chain (a detached `glue watch`): the copy `glue up` wrote serves.
    assert backend.bucket_credentials().secret_key == local_bucket.creds.secret_key
    assert own_bucket.release(kit.home) and not copy.exists() and not own.record_path(kit.home).exists()

"""Your own bucket in the cluster config: validated fields (one line naming the field), kept across
`glue up`s, the options combined as a user means them (glue.operations.own_bucket.choose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glue.bucket_access import BucketCredentials, own
from glue.cloud import get_backend, own_bucket
from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.operations.own_bucket import Asked, choose

GOOD = {"endpoint": "https://s3.eu-central-1.amazonaws.com/", "name": "team-ckpt", "region": "eu-central-1"}


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("endpoint", "s3.amazonaws.com", "bucket endpoint: 's3.amazonaws.com' is not an S3 endpoint URL"),
    ("endpoint", "https://s3.amazonaws.com/team-ckpt", "is not an S3 endpoint URL"),
    ("name", "Team_Ckpt", "bucket name: 'Team_Ckpt' is not a bucket name"),
    ("name", "s3://team-ckpt", "is not a bucket name"),
    ("region", "EU Central", "bucket region: 'EU Central' is not a region"),
    ("profile", "a b", "bucket profile: 'a b' is not an AWS profile name"),
    ("secret_key", "x", "bucket secret_key: Extra inputs are not permitted"),
])
def test_a_bad_field_is_one_line(field: str, value: str, needle: str) -> None:
    with pytest.raises(GlueError) as err:
        own.OwnBucket.parse({**GOOD, field: value}, "glue up")
    assert str(err.value).startswith("glue up: ") and needle in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_the_cluster_config_keeps_it(tmp_path: Path) -> None:
    cfg = ClusterConfig(backend="ssh", bucket=own.OwnBucket.parse(GOOD, "t").model_dump())
    cfg.save(tmp_path)
    back = ClusterConfig.load(tmp_path)
    assert back == cfg and back.bucket is not None
    assert back.bucket["endpoint"] == "https://s3.eu-central-1.amazonaws.com"  # the trailing slash gone
    raw = json.loads((tmp_path / "cluster.json").read_text())
    raw["bucket"]["name"] = "UPPER"
    (tmp_path / "cluster.json").write_text(json.dumps(raw))
    with pytest.raises(GlueError, match=r"cluster.json: bucket name: 'UPPER' is not a bucket name"):
        ClusterConfig.load(tmp_path)


def test_options_combine_as_meant(tmp_path: Path) -> None:
    cfg = ClusterConfig(backend="ssh")
    with pytest.raises(GlueError, match="needs both --bucket-endpoint URL and --bucket NAME"):
        choose(tmp_path, cfg, Asked(endpoint="https://s3.amazonaws.com"))
    with pytest.raises(GlueError, match="needs both --bucket-endpoint URL and --bucket NAME"):
        choose(tmp_path, cfg, Asked(region="eu-central-1"))
    choose(tmp_path, cfg, Asked(endpoint=GOOD["endpoint"], name="team-ckpt", region="eu-central-1", profile="t"))
    assert cfg.bucket == {"endpoint": "https://s3.eu-central-1.amazonaws.com", "name": "team-ckpt",
                          "region": "eu-central-1", "profile": "t"}
    choose(tmp_path, cfg, Asked(profile="other"))  # the same bucket, another profile
    assert cfg.bucket["profile"] == "other" and cfg.bucket["region"] == "eu-central-1"
    choose(tmp_path, cfg, Asked(endpoint="http://127.0.0.1:9000", name="local-b"))  # another bucket: nothing carried
    assert cfg.bucket == {"endpoint": "http://127.0.0.1:9000", "name": "local-b", "region": "", "profile": ""}
    with pytest.raises(GlueError, match="--kit-bucket goes back"):
        choose(tmp_path, cfg, Asked(name="x-y-z", kit_bucket=True))
    choose(tmp_path, cfg, Asked(kit_bucket=True))
    assert cfg.bucket is None


def test_the_kit_homes_record_serves_every_command(tmp_path: Path) -> None:
    """After `glue up` adopted a bucket, a `glue up` without options keeps it, and the backend serves it;
    a damaged record is one line."""
    bucket = own.OwnBucket.parse(GOOD, "t")
    own_bucket.adopt(tmp_path, bucket, BucketCredentials("AKIAEXAMPLE", "secret-example"))
    cfg = ClusterConfig(backend="ssh")
    choose(tmp_path, cfg, Asked())
    assert cfg.bucket == bucket.model_dump()
    assert get_backend("ssh", tmp_path).bucket() == bucket.info
    assert "secret-example" not in own.record_path(tmp_path).read_text()
    own.record_path(tmp_path).write_text("{not json")
    with pytest.raises(GlueError, match=r"own.json cannot be read .*: run `glue up` again"):
        get_backend("ssh", tmp_path)


def test_the_backends_own_keys_are_set_aside_never_overwritten(tmp_path: Path) -> None:
    """The loopback bucket's (or Lyceum's) credentials file is kept aside while your bucket serves, and put
    back by --kit-bucket; your keys' copy is 0600 and goes with it."""
    kit_keys = tmp_path / "bucket" / "credentials.json"
    kit_keys.parent.mkdir()
    kit_keys.write_text('{"access_key": "gk-local", "secret_key": "local-secret"}')
    own_bucket.adopt(tmp_path, own.OwnBucket.parse(GOOD, "t"), BucketCredentials("AKIAEXAMPLE", "secret-example"))
    assert json.loads(kit_keys.read_text())["secret_key"] == "secret-example"
    assert kit_keys.stat().st_mode & 0o777 == 0o600
    assert "local-secret" in (tmp_path / "bucket" / own_bucket.KIT_CREDENTIALS_ASIDE).read_text()
    assert own_bucket.release(tmp_path)
    assert json.loads(kit_keys.read_text())["secret_key"] == "local-secret"
    assert not own.record_path(tmp_path).exists() and not own_bucket.release(tmp_path)

"""Your own S3-compatible bucket (AWS S3, R2, MinIO, GCS's S3 API): where it is, as the cluster config keeps
it (`glue up --bucket-endpoint URL --bucket NAME [--bucket-region R] [--bucket-profile P]`), and its
credentials, resolved by boto3's own chain (the environment's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, else the AWS profile: --bucket-profile or AWS_PROFILE, with the shared credentials and
config files, SSO and credential_process). The record holds no secret: credentials are never part of it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.errors import GlueError

# S3's bucket naming rules (3-63 characters: lowercase letters, digits, dots and hyphens, a letter or digit
# at each end); R2, MinIO and GCS hold to the same.
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9-]{0,40}$")
_PROFILE = re.compile(r"^[A-Za-z0-9_.@+=,-]{1,64}$")
# The controller's chain never asks a metadata service: the VMs get a copy of what it finds, and an
# instance role's hourly credentials would stop working there without a word.
_NO_METADATA = ("iam-role", "container-role")


class OwnBucket(BaseModel):
    """The user's bucket as the cluster config keeps it (cluster.json's `bucket`, <home>/bucket/own.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str
    name: str
    region: str = ""
    profile: str = ""  # an AWS profile's name (not a secret); "" = the environment, else AWS_PROFILE/default

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        url = urlparse(value)
        if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/") or url.query:
            raise ValueError(f"{value!r} is not an S3 endpoint URL: give scheme and host, e.g. "
                             "https://s3.eu-central-1.amazonaws.com or http://127.0.0.1:9000")
        return value.rstrip("/")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value) or ".." in value:
            raise ValueError(f"{value!r} is not a bucket name: 3-63 lowercase letters, digits, dots and hyphens, "
                             "starting and ending with a letter or digit (the bucket itself, no s3:// and no path)")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.match(value):
            raise ValueError(f"{value!r} is not a region: e.g. eu-central-1, auto (R2), us-east-1")
        return value

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if value and not _PROFILE.match(value):
            raise ValueError(f"{value!r} is not an AWS profile name (letters, digits and _.@+=,-)")
        return value

    @classmethod
    def parse(cls, raw: Any, where: str) -> OwnBucket:
        """Validated, or one GlueError line naming the field, what is wrong and where it came from."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "bucket"
            why = str(err["msg"]).removeprefix("Value error, ")
            raise GlueError(f"{where}: bucket {field}: {why}") from None

    @property
    def info(self) -> BucketInfo:
        return BucketInfo(endpoint=self.endpoint, name=self.name, region=self.region)

    def describe(self) -> str:
        return f"s3://{self.name} at {self.endpoint}" + (f" ({self.region})" if self.region else "")


def record_path(home: Path) -> Path:
    """The bucket `glue up` configured last: read by every command (and the provider inside terraform)."""
    return home / "bucket" / "own.json"


def load(home: Path) -> OwnBucket | None:
    """The configured own bucket, or None where the backend's own bucket serves."""
    path = record_path(home)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise GlueError(f"{path} cannot be read ({exc}): run `glue up` again with --bucket-endpoint and "
                        "--bucket (or --kit-bucket)") from None
    return OwnBucket.parse(raw, str(path))


def resolve(own: OwnBucket) -> BucketCredentials | None:
    """The credentials boto3's chain finds for this bucket (environment, then the profile), or None."""
    import botocore.session  # imported here: most commands never resolve credentials (boto3 costs ~0.2 s)
    from botocore.exceptions import BotoCoreError

    try:
        # boto3's chain is botocore's: an explicit profile first (its keys, SSO, assume-role,
        # credential_process), else the environment's keys, then AWS_PROFILE or the default profile.
        bs = botocore.session.Session(profile=own.profile or None)
        resolver = bs.get_component("credential_provider")
        for name in _NO_METADATA:
            try:
                resolver.remove(name)
            except (KeyError, ValueError):
                pass
        found = bs.get_credentials()
        frozen = found.get_frozen_credentials() if found is not None else None
    except BotoCoreError as exc:  # a missing profile, a broken credentials file, a failed SSO or credential_process
        raise GlueError(f"the credentials for {own.describe()} cannot be read: {' '.join(str(exc).split())}; "
                        "fix the AWS profile, or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
    if frozen is None or not frozen.access_key or not frozen.secret_key:
        return None
    expiry = getattr(found, "_expiry_time", None)
    return BucketCredentials(access_key=frozen.access_key, secret_key=frozen.secret_key,
                             session_token=frozen.token or None,
                             expires_at=expiry.timestamp() if expiry is not None else None)


def no_credentials(own: OwnBucket) -> GlueError:
    where = f"profile {own.profile!r}" if own.profile else "the environment or an AWS profile"
    return GlueError(f"no credentials for {own.describe()} in {where}: export AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or name a profile with --bucket-profile "
                     "or AWS_PROFILE")

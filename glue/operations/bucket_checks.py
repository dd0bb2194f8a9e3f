"""The bucket probe of `glue doctor` and of `glue up` before anything is configured: what gpukit relies on,
tried on one object under layout.DOCTOR_PREFIX: a write, the bytes read back, the key listed, a ranged GET
(its bytes and Content-Range), a delete after which a plain GET is 404 (on a versioned bucket: a delete
marker hides the object), and whether the bucket keeps versions. One `Check` line: what held, or the step
that failed with the bucket named and the fix. The probe leaves nothing behind (a versioned bucket's
versions of the probe object are deleted too, where the credentials may)."""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.checks import Check
from glue.storage import bucket as bucket_store
from glue.train import layout

NAME = "bucket probe"
SIZE = 64
RANGE = (5, 20)  # bytes=5-20: 16 bytes from inside the object
# What a refusal means, by S3 error code: (what is wrong, the fix).
_CODES = {
    "NoSuchBucket": ("there is no such bucket at this endpoint",
                     "create the bucket, or fix --bucket / --bucket-endpoint"),
    "InvalidAccessKeyId": ("the endpoint does not know the access key", "check AWS_ACCESS_KEY_ID or the AWS profile"),
    "SignatureDoesNotMatch": ("the endpoint rejects the secret key's signature",
                              "check AWS_SECRET_ACCESS_KEY or the AWS profile (and --bucket-region)"),
    "AuthorizationHeaderMalformed": ("the endpoint wants another signing region",
                                     "set --bucket-region to the bucket's"),
    "PermanentRedirect": ("the bucket is in another region or behind another endpoint",
                          "use the bucket's regional endpoint and --bucket-region"),
    "ExpiredToken": ("the session token has expired", "refresh the credentials (aws sso login, a new STS token)"),
}
# What each step needs when the bucket refuses it for no reason above.
_NEEDS = {
    "write": "give the credentials write access (s3:PutObject) or name a bucket they can write",
    "read back": "give the credentials read access (s3:GetObject)",
    "list": "give the credentials list access (s3:ListBucket)",
    "ranged GET": "give the credentials read access (s3:GetObject)",
    "delete": "give the credentials delete access (s3:DeleteObject): gpukit deletes stale records and checkpoints",
    "GET after delete": "check the endpoint (a cache or proxy in front of it?)",
}


@dataclass
class _Probe:
    info: BucketInfo
    key: str
    body: bytes = field(default_factory=lambda: secrets.token_bytes(SIZE))
    versions: list[str] = field(default_factory=list)  # the probe object's versions (a versioned bucket)
    versioning: str = "?"

    @property
    def where(self) -> str:
        return f"s3://{self.info.name} at {self.info.endpoint}"

    def fail(self, step: str, what: str, fix: str = "") -> Check:
        return Check(NAME, False, f"{self.where}: {step} of {self.key}: {what}", fix or _NEEDS.get(step, ""))


def _refusal(exc: ClientError) -> tuple[str, str]:
    err = exc.response.get("Error", {})
    code = str(err.get("Code") or "?")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    said = " ".join(str(err.get("Message") or "").split())[:160]
    what, fix = _CODES.get(code, ("refused", ""))
    return f"{what} ({code}{f', HTTP {status}' if status else ''}{f': {said}' if said else ''})", fix


def probe(info: BucketInfo, creds: BucketCredentials) -> Check:
    """Every step in turn on one object; the first that fails is the line."""
    p = _Probe(info, layout.doctor_probe_key(socket.gethostname(), secrets.token_hex(6)))
    s3 = bucket_store.client(info, creds, timeout=5.0)
    step, written, deleted = "write", False, False
    try:
        put = s3.put_object(Bucket=info.name, Key=p.key, Body=p.body)
        written = True
        p.versions += [put["VersionId"]] if put.get("VersionId") not in (None, "", "null") else []
        step = "read back"
        if (got := bucket_store.read(s3, info.name, p.key)) != p.body:
            return p.fail(step, "missing after a successful write" if got is None else
                          f"{len(got)} bytes came back, not the {SIZE} written", "check the endpoint: it loses writes")
        step = "list"
        listed = s3.list_objects_v2(Bucket=info.name, Prefix=p.key).get("Contents", [])
        if p.key not in [o.get("Key") for o in listed]:
            return p.fail(step, "a list of its prefix does not show it", "check the endpoint's listings")
        step = "ranged GET"
        if (bad := _ranged(info, creds, p)) is not None:
            return bad
        step = "versioning"
        p.versioning = _versioning(s3, info.name)
        step = "delete"
        gone = s3.delete_object(Bucket=info.name, Key=p.key)
        deleted = True
        p.versions += [gone["VersionId"]] if gone.get("DeleteMarker") and gone.get("VersionId") else []
        step = "GET after delete"
        if bucket_store.read(s3, info.name, p.key) is not None:
            return p.fail(step, "the object is still served (a plain GET must be 404 NoSuchKey, as after a "
                                "delete marker on a versioned bucket)")
    except EndpointConnectionError as exc:
        return p.fail(step, f"the endpoint does not answer ({exc})", "check --bucket-endpoint (scheme, host, port)")
    except ClientError as exc:
        what, fix = _refusal(exc)
        return p.fail(step, what, fix)
    except BotoCoreError as exc:
        return p.fail(step, " ".join(str(exc).split())[:200], "check --bucket-endpoint and the credentials")
    finally:
        left = _clean_up(s3, p, written and not deleted)
    return Check(NAME, True, f"{p.where}: wrote, read back, listed, ranged GET (bytes {RANGE[0]}-{RANGE[1]}, "
                             f"Content-Range checked), deleted (a GET then 404s) {layout.DOCTOR_PREFIX}…; "
                             f"{_versioning_note(p.versioning)}{left}")


def _ranged(info: BucketInfo, creds: BucketCredentials, p: _Probe) -> Check | None:
    """A ranged GET returns exactly those bytes, with `Content-Range: bytes a-b/size`. Its client
    validates no checksum: some servers send the whole object's with a part (rclone serve s3 does)."""
    lo, hi = RANGE
    got = bucket_store.client(info, creds, timeout=5.0, checksums=False).get_object(
        Bucket=info.name, Key=p.key, Range=f"bytes={lo}-{hi}")
    data = got["Body"].read()
    status = got.get("ResponseMetadata", {}).get("HTTPStatusCode")
    content_range = str(got.get("ContentRange") or "")
    if data == p.body:
        return p.fail("ranged GET", "the endpoint ignores Range and sends the whole object",
                      "use an endpoint that honours Range: gpukit restores checkpoints in ranged parts")
    # The bytes and Content-Range are what a reader relies on; the status is not checked (206 on AWS, while
    # rclone serve s3 answers a good range with 200).
    if data != p.body[lo:hi + 1] or content_range != f"bytes {lo}-{hi}/{SIZE}":
        return p.fail("ranged GET", f"bytes={lo}-{hi} came back as HTTP {status}, {len(data)} bytes, Content-Range "
                      f"{content_range or 'missing'} (expected {hi - lo + 1} bytes, bytes {lo}-{hi}/{SIZE})",
                      "use an S3-compatible endpoint that implements ranged GETs")
    return None


def _versioning(s3: Any, bucket: str) -> str:
    """Enabled, Suspended, "" (never enabled), or "?" where the bucket will not say."""
    try:
        return str(s3.get_bucket_versioning(Bucket=bucket).get("Status") or "")
    except (ClientError, BotoCoreError):
        return "?"


def _versioning_note(status: str) -> str:
    if status == "":
        return "not versioned: a delete removes the object"
    if status == "?":
        return "versioning not reported (GetBucketVersioning refused); a delete hid the object all the same"
    return (f"versioning {status}: a delete leaves a delete marker (a GET then 404s, as gpukit needs) and keeps the "
            "old version; gpukit never reads old versions, and what it deletes (pruned checkpoints, stale "
            "records) stays stored and billed until a lifecycle rule expires noncurrent versions")


def _clean_up(s3: Any, p: _Probe, delete: bool) -> str:
    """Remove the probe object (a failed step left it) and its versions; a note when some stay."""
    try:
        if delete:
            gone = s3.delete_object(Bucket=p.info.name, Key=p.key)
            p.versions += [gone["VersionId"]] if gone.get("DeleteMarker") and gone.get("VersionId") else []
        for version in p.versions:
            s3.delete_object(Bucket=p.info.name, Key=p.key, VersionId=version)
    except (ClientError, BotoCoreError):
        return (f"; the probe's versions of {p.key} stay (the credentials may not delete versions: "
                "s3:DeleteObjectVersion)") if p.versions else f"; {p.key} could not be deleted"
    return ""

"""A backend whose bucket is the user's own (glue.bucket_access.own): every VM, record and probe uses it in
place of the backend's bucket; everything else is the backend's. `get_backend` wraps a backend in it while
the kit home's record (<home>/bucket/own.json, written by `glue up`) names a bucket.

Credentials come from boto3's chain at each use (the environment, the AWS profile); where the chain finds
none (a detached `glue watch`), from the 0600 copy `glue up` wrote for the VMs' mount
(<home>/bucket/credentials.json: the file the inventory names, never the secret)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo, own
from glue.cloud.base import Backend, VMRecord, VMSpec
from glue.cloud.checks import Check, Readiness
from glue.errors import GlueError
from glue.paths import write_secret

KIT_CREDENTIALS_ASIDE = "credentials.kit-bucket.json"  # the backend's own bucket keys, while the user's serve


def credentials_path(home: Path) -> Path:
    return home / "bucket" / "credentials.json"


def read_copy(home: Path) -> BucketCredentials | None:
    try:
        raw = json.loads(credentials_path(home).read_text())
        return BucketCredentials(access_key=str(raw["access_key"]), secret_key=str(raw["secret_key"]),
                                 session_token=raw.get("session_token") or None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_copy(home: Path, creds: BucketCredentials) -> None:
    """The VMs' copy (0600, replaced atomically); rewritten only when it changed (the playbook's inputs hash it)."""
    doc = {"access_key": creds.access_key, "secret_key": creds.secret_key,
           **({"session_token": creds.session_token} if creds.session_token else {})}
    try:
        if json.loads(credentials_path(home).read_text()) == doc:
            return
    except (OSError, ValueError):
        pass
    write_secret(credentials_path(home), json.dumps(doc))


def adopt(home: Path, bucket: own.OwnBucket, creds: BucketCredentials) -> None:
    """Make `bucket` the kit home's bucket (after its checks passed). The backend's own bucket keys (the
    loopback server's, Lyceum's) are set aside, never overwritten: `--kit-bucket` puts them back."""
    path = own.record_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.parent / KIT_CREDENTIALS_ASIDE
    if not path.exists() and credentials_path(home).exists() and not aside.exists():
        credentials_path(home).replace(aside)
    write_copy(home, creds)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(bucket.model_dump_json())
    tmp.replace(path)


def release(home: Path) -> bool:
    """Back to the backend's own bucket: the record and the user's keys' copy removed, the backend's put
    back. False when no own bucket was configured."""
    path = own.record_path(home)
    if not path.exists():
        return False
    credentials_path(home).unlink(missing_ok=True)
    aside = path.parent / KIT_CREDENTIALS_ASIDE
    if aside.exists():
        aside.replace(credentials_path(home))
    path.unlink()
    return True


class OwnBucketBackend:
    """`inner` with the user's bucket: bucket(), bucket_credentials() and doctor's probe target are the
    user's; the VM calls and every other attribute are the backend's."""

    credentials_expire = False  # the user's keys are pushed by `glue up`, not refreshed by the kit
    bucket_on_host = False

    def __init__(self, inner: Backend, home: Path, bucket: own.OwnBucket) -> None:
        self.inner = inner
        self.home = home
        self.own = bucket
        self.name = inner.name
        self.baked_image = inner.baked_image
        self.multi_node = inner.multi_node
        self.takes_config_seed = inner.takes_config_seed
        self.deletes_vms = inner.deletes_vms

    def __getattr__(self, attr: str) -> Any:  # a backend's own extras (announce_termination, ...)
        return getattr(self.inner, attr)

    def check_host(self) -> None:
        self.inner.check_host()

    def readiness(self) -> Readiness:
        """The backend's checks; the probe's target is the user's bucket (a ✗ line when no credentials)."""
        found = self.inner.readiness()
        try:
            creds = self.bucket_credentials()
        except GlueError as exc:
            return Readiness([*found.checks, Check("bucket probe", False, str(exc), "see the message")])
        return Readiness(found.checks, self.own.info, creds)

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        return self.inner.tf_vars(vm_count, name_prefix, ssh_public_key)

    def spares_problem(self) -> str | None:
        return self.inner.spares_problem()

    def create_vm(self, spec: VMSpec) -> VMRecord:
        return self.inner.create_vm(spec)

    def read_vm(self, vm_id: str) -> VMRecord | None:
        return self.inner.read_vm(vm_id)

    def delete_vm(self, vm_id: str) -> None:
        self.inner.delete_vm(vm_id)

    def owned_vm_ids(self) -> list[str]:
        return self.inner.owned_vm_ids()

    def bucket(self) -> BucketInfo:
        return self.own.info

    def bucket_credentials(self) -> BucketCredentials:
        found = own.resolve(self.own) or read_copy(self.home)
        if found is None:
            raise own.no_credentials(self.own)
        return found


def wrap(backend: Backend, home: Path) -> Backend:
    """`backend`, with the user's bucket when the kit home's record names one."""
    bucket = own.load(home)
    return backend if bucket is None else OwnBucketBackend(backend, home, bucket)

"""`glue up`'s own-bucket step, before anything else is touched: which bucket this cluster uses (the options,
else as last time), its credentials from boto3's chain, and the probe (glue.operations.bucket_checks). A
bucket that fails the probe stops `glue up` with one line: no record, no credentials copy, no cluster
config, no terraform, no VM. Only a bucket that passed becomes the kit home's (glue.cloud.own_bucket.adopt).
Switching buckets under live VMs is refused: their runs' records are in the bucket they use."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from glue.bucket_access import own
from glue.cloud import own_bucket
from glue.cluster import current
from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.operations import bucket_checks


@dataclass(frozen=True)
class Asked:
    """The bucket options of one `glue up` (None: not given)."""

    endpoint: str | None = None
    name: str | None = None
    region: str | None = None
    profile: str | None = None
    kit_bucket: bool = False

    def any(self) -> bool:
        return any(v is not None for v in (self.endpoint, self.name, self.region, self.profile))


def choose(home: Path, cfg: ClusterConfig, asked: Asked) -> None:
    """Set cfg.bucket from the options, else keep the kit home's (as last time); validated, one line when not."""
    if asked.kit_bucket:
        if asked.any():
            raise GlueError("--kit-bucket goes back to the backend's own bucket: leave out --bucket-endpoint, "
                            "--bucket, --bucket-region and --bucket-profile")
        cfg.bucket = None
        return
    recorded = own.load(home)
    if recorded is not None and cfg.bucket is None:
        cfg.bucket = recorded.model_dump()  # as last time, even when an interrupted `glue up` saved no config
    if not asked.any():
        return
    if asked.endpoint is not None or asked.name is not None:
        if asked.endpoint is None or asked.name is None:
            raise GlueError("your own bucket needs both --bucket-endpoint URL and --bucket NAME "
                            "(docs/guides/own-bucket.md)")
        base: dict[str, str] = {}  # another bucket: nothing of the last one's region or profile carries over
    elif cfg.bucket is None:
        raise GlueError("--bucket-region and --bucket-profile belong to your own bucket, which needs both "
                        "--bucket-endpoint URL and --bucket NAME")
    else:
        base = dict(cfg.bucket)
    given = {"endpoint": asked.endpoint, "name": asked.name, "region": asked.region, "profile": asked.profile}
    chosen = own.OwnBucket.parse({**base, **{k: v for k, v in given.items() if v is not None}}, "glue up")
    cfg.bucket = chosen.model_dump()


def prepare(home: Path, cfg: ClusterConfig, say: Callable[[str], None]) -> Callable[[], None]:
    """Probe the chosen bucket (one line when it fails: nothing written). Returns what makes it the kit
    home's (or goes back to the backend's), for `glue up` to call once its other checks passed."""
    recorded = own.load(home)
    wanted = own.OwnBucket.parse(cfg.bucket, "the cluster config") if cfg.bucket is not None else None
    if wanted is not None and cfg.backend == "terraform":
        raise GlueError("with --backend terraform your module's `bucket` output names the bucket (credentials from "
                        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY): leave out --bucket-endpoint and --bucket, or "
                        "`glue up --kit-bucket` to forget the one set before (docs/guides/own-terraform.md)")
    if _where(wanted) != _where(recorded):  # another profile or region for the same bucket is no switch
        _no_live_vms(home, recorded, wanted)
    if wanted is None:
        return lambda: _release(home, say)
    creds = own.resolve(wanted)
    if creds is None and _where(wanted) == _where(recorded):
        creds = own_bucket.read_copy(home)  # as last time: the keys the VMs hold (a new shell, no AWS_* set)
    if creds is None:
        raise own.no_credentials(wanted)
    check = bucket_checks.probe(wanted.info, creds)
    if not check.ok:
        raise GlueError(f"{check.detail}; fix: {check.fix}. Nothing was configured")
    say(f"bucket: ✓ {check.detail}")
    if creds.expires_at is not None:
        left = (creds.expires_at - time.time()) / 60
        say(f"bucket: these credentials expire in {left:.0f} min and the VMs' mount keeps this copy: use "
            "long-lived keys for the bucket, or run `glue up` again with fresh ones before then")
    return lambda: own_bucket.adopt(home, wanted, creds)


def _release(home: Path, say: Callable[[str], None]) -> None:
    if own_bucket.release(home):
        say("bucket: back to the backend's own bucket (your bucket and its data are untouched)")


def _where(bucket: own.OwnBucket | None) -> tuple[str, str] | None:
    return (bucket.endpoint, bucket.name) if bucket is not None else None


def _no_live_vms(home: Path, before: own.OwnBucket | None, after: own.OwnBucket | None) -> None:
    vms = current.hosts(home)
    if not vms:
        return
    was = before.describe() if before is not None else "the backend's own bucket"
    now = after.describe() if after is not None else "the backend's own bucket"
    raise GlueError(f"this cluster's {len(vms)} VM(s) use {was}, and their runs' records are there: `glue down` "
                    f"first, then `glue up` with {now}")

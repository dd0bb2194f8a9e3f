"""Controller-side records of a run in the bucket (layout: docs/design.md, section 4 "Bucket layout")."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud import get_backend
from glue.cluster import current
from glue.errors import GlueError
from glue.runs.config import check_run_id
from glue.storage import bucket as bucket_store
from glue.train import layout
from glue.train.layout import heartbeat_key


def utc_iso(ts: datetime | None = None) -> str:
    return (ts or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


# Expiring credentials are renewed this long before they expire: a recovery or a drill can outlive them.
REFRESH_MARGIN_S = 120.0
# What every reader of a manifest relies on (deploy writes them; see docs/design.md).
MANIFEST_BLOCKS = ("config",)


@dataclass
class RunStore:
    info: BucketInfo
    creds: BucketCredentials
    run: str
    # Where fresh credentials come from (the backend), for credentials that expire (Lyceum's STS ones).
    refresh: Callable[[], BucketCredentials] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._s3 = bucket_store.client(self.info, self.creds)
        self.prefix = f"runs/{self.run}/"

    @classmethod
    def open(cls, home: Path, run_id: str) -> RunStore:
        """A run's records in the cluster's bucket, signed with the backend's (refreshing) credentials."""
        check_run_id(run_id)  # before any bucket call: a bad id is a usage error, not an S3 one
        backend = get_backend(current.ClusterConfig.load(home).backend, home)
        return cls(current.bucket_info(home), backend.bucket_credentials(), run_id, refresh=backend.bucket_credentials)

    @property
    def s3(self) -> Any:
        """The boto3 client, rebuilt with fresh credentials when the current ones near their expiry."""
        expires = self.creds.expires_at
        if self.refresh is not None and expires is not None and expires - time.time() < REFRESH_MARGIN_S:
            self.creds = self.refresh()
            self._s3 = bucket_store.client(self.info, self.creds)
        return self._s3

    def _fail(self, what: str, exc: Exception) -> GlueError:
        return GlueError(f"bucket {self.info.name} at {self.info.endpoint} did not answer ({what}): "
                         f"{str(exc).splitlines()[0]}; check `glue status`")

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return bucket_store.read(self.s3, self.info.name, self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"get {key}", exc) from exc

    def get_json(self, key: str) -> Any:
        try:
            return bucket_store.read_json(self.s3, self.info.name, self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"get {key}", exc) from exc
        except ValueError as exc:
            raise GlueError(f"{self.prefix}{key} in bucket {self.info.name} is not valid JSON ({exc}); "
                            "it was written by something other than glue, or is damaged") from exc

    def put_json(self, key: str, value: Any) -> None:
        self.put_bytes(key, json.dumps(value, indent=2, sort_keys=True).encode())

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.s3.put_object(Bucket=self.info.name, Key=self.prefix + key, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"put {key}", exc) from exc

    def keys(self, sub: str = "") -> dict[str, int]:
        """key (relative to the run) -> size, for everything under runs/<run>/<sub>."""
        out: dict[str, int] = {}
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.info.name, Prefix=self.prefix + sub)
            for page in pages:
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(self.prefix):]] = int(obj["Size"])
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"list {sub}", exc) from exc
        return out

    def exists(self) -> bool:
        return self.get_bytes("manifest.json") is not None

    def manifest(self) -> dict[str, Any]:
        m = self.get_json("manifest.json")
        if m is None:
            raise GlueError(f"unknown run {self.run!r}: no runs/{self.run}/manifest.json in the bucket "
                            "(list runs with `glue status --json`)")
        if not isinstance(m, dict) or not all(isinstance(m.get(k), dict) for k in MANIFEST_BLOCKS):
            raise self._not_glue("manifest.json", "a run manifest is an object with "
                                 + ", ".join(f'a "{k}" object' for k in MANIFEST_BLOCKS))
        return m

    def attempts(self) -> list[int]:
        return sorted(n for n in map(layout.attempt_of, self.keys(layout.ATTEMPTS_PREFIX)) if n is not None)

    def attempt(self, n: int) -> dict[str, Any]:
        rec = self.get_json(layout.attempt_key(n))
        if rec is None:
            return {}
        if not isinstance(rec, dict) or rec.get("attempt") != n:
            raise self._not_glue(layout.attempt_key(n), f"an attempt record is an object with \"attempt\": {n}")
        return rec

    def put_attempt(self, record: dict[str, Any]) -> None:
        """The attempt record, under its key (layout.attempt_key)."""
        self.put_json(layout.attempt_key(int(record["attempt"])), record)

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        """The supervisor's exit record of attempt n on a node (None while it runs, or when its VM died)."""
        return self.get_json(layout.exit_key(n, node))

    def errors(self, n: int) -> list[dict[str, Any]]:
        """Every rank's error files of attempt n, in key order."""
        return [e for e in (self.get_json(k) for k in sorted(self.keys(layout.errors_prefix(n)))) if e]

    def notices(self, n: int) -> list[dict[str, Any]]:
        return [d for d in (self.get_json(k) for k in sorted(self.keys(layout.notices_prefix(n)))) if d]

    def _not_glue(self, key: str, shape: str) -> GlueError:
        return GlueError(f"{self.prefix}{key} in bucket {self.info.name} is not a record glue wrote ({shape}); it "
                         "was written by something else, or is damaged: put the original back, or move the run's "
                         "records aside")

    def metrics(self, rank: int = 0) -> dict[int, dict[int, dict[str, Any]]]:
        """attempt -> step -> record of one rank, from every metrics part (in write order: a torchrun
        restart's replayed steps replace the first run's) and the steps the rank's last heartbeat
        carried that had not reached a part yet."""
        out: dict[int, dict[int, dict[str, Any]]] = {}
        records: list[dict[str, Any]] = []
        for key in sorted(self.keys("metrics/")):
            if f"-r{rank}-" not in key:
                continue
            records += [json.loads(line) for line in (self.get_bytes(key) or b"").decode().splitlines()
                        if line.strip()]
        records += (self.get_json(heartbeat_key(rank)) or {}).get("recent", [])
        for rec in records:
            if rec.get("rank", 0) == rank:
                out.setdefault(int(rec["attempt"]), {})[int(rec["step"])] = rec
        return out

    def heartbeat(self, rank: int = 0) -> dict[str, Any] | None:
        """The rank's last heartbeat (whichever attempt wrote it), or None."""
        beat = self.get_json(heartbeat_key(rank))
        return beat if isinstance(beat, dict) else None

    def heartbeats(self, attempt: int) -> list[dict[str, Any]]:
        """The last heartbeat of every rank of an attempt, rank 0 first."""
        beats = []
        for key in sorted(self.keys("heartbeat")):
            beat = self.get_json(key)
            if beat is None:
                # Listed, yet missing: rclone's local bucket answers NoSuchKey for a moment while a
                # record is replaced. A lost beat would make a live run look stalled.
                time.sleep(0.2)
                beat = self.get_json(key)
            if beat and beat.get("attempt") == attempt:
                beats.append(beat)
        return sorted(beats, key=lambda b: int(b.get("rank", 0)))

    def log_text(self, attempt: int | None = None, node: int | None = None) -> str:
        """The shipped log of an attempt (every node's, node 0 first), or of one node."""
        def wanted(k: str) -> bool:
            head = "logs/" if attempt is None else f"logs/{attempt:03d}-"
            if not k.startswith(head) or node is None:
                return k.startswith(head)
            rest = k[len(head):]  # node 0 keeps the single-node names: <attempt>-<part>.log
            return rest.startswith(f"n{node}-") if node else rest[:1].isdigit()

        parts = [k for k in sorted(self.keys("logs/")) if wanted(k)]
        return "".join((self.get_bytes(k) or b"").decode(errors="replace") for k in parts)


def run_ids(info: BucketInfo, creds: BucketCredentials) -> list[str]:
    """The runs glue deployed: prefixes under runs/ with a manifest. A Checkpointer of your own pointed at
    runs/<name> (no manifest) is your data, not a run to list, watch or guard."""
    s3 = bucket_store.client(info, creds)
    try:
        prefixes = [p["Prefix"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=info.name, Prefix="runs/", Delimiter="/") for p in page.get("CommonPrefixes", [])]
        # One small read per prefix not yet known as a run; a manifest is written once and glue never
        # removes it, so a run stays known (a watcher of every run lists the bucket on every poll).
        unknown = [p for p in prefixes if (info.endpoint, info.name, p) not in _KNOWN_RUNS]
        with ThreadPoolExecutor(max_workers=8) as pool:
            have = list(pool.map(lambda p: bucket_store.read(s3, info.name, f"{p}manifest.json") is not None,
                                 unknown))
    except (ClientError, BotoCoreError) as exc:
        raise GlueError(f"bucket {info.name} at {info.endpoint} did not answer: {str(exc).splitlines()[0]}") from exc
    _KNOWN_RUNS.update((info.endpoint, info.name, p) for p, ok in zip(unknown, have, strict=True) if ok)
    return sorted(p.split("/")[1] for p in prefixes if (info.endpoint, info.name, p) in _KNOWN_RUNS)


_KNOWN_RUNS: set[tuple[str, str, str]] = set()  # (endpoint, bucket, "runs/<id>/") with a manifest


def all_run_ids(home: Path) -> list[str]:
    """Every run in the cluster's bucket."""
    backend = get_backend(current.ClusterConfig.load(home).backend, home)
    return run_ids(current.bucket_info(home), backend.bucket_credentials())

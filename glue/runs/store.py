"""Controller-side records of a run in the bucket: one method per record, read or written (keys:
glue.train.layout, the one module that names them; fields: docs/design.md, section 4 "Bucket layout")."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cluster import current
from glue.errors import GlueError
from glue.runs.clock import parse_iso as parse_iso  # the records' clock, where callers found it
from glue.runs.clock import utc_iso as utc_iso
from glue.runs.config import check_run_id
from glue.runs.records import AttemptRecord, Manifest, RecoveryRecord
from glue.storage import bucket as bucket_store
from glue.train import layout

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
        self.prefix = layout.run_prefix(self.run)

    @classmethod
    def open(cls, home: Path, run_id: str) -> RunStore:
        """A run's records in the cluster's bucket, signed with the backend's (refreshing) credentials."""
        check_run_id(run_id)  # before any bucket call: a bad id is a usage error, not an S3 one
        backend = current.backend(home)
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
            try:
                return bucket_store.read_json(self.s3, self.info.name, self.prefix + key)
            except ValueError:
                # A serverless run writes its records in place through the platform's mount: one read can
                # land in the middle of a write. Read once more before calling the record damaged.
                time.sleep(0.2)
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

    def delete(self, key: str) -> None:
        try:
            self.s3.delete_object(Bucket=self.info.name, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"delete {key}", exc) from exc

    def listing(self, sub: str = "") -> dict[str, tuple[int, datetime]]:
        """key (relative to the run) -> (size, the store's LastModified), for everything under runs/<run>/<sub>."""
        out: dict[str, tuple[int, datetime]] = {}
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.info.name, Prefix=self.prefix + sub)
            for page in pages:
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(self.prefix):]] = (int(obj["Size"]), obj["LastModified"])
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"list {sub}", exc) from exc
        return out

    def keys(self, sub: str = "") -> dict[str, int]:
        """key (relative to the run) -> size, for everything under runs/<run>/<sub>."""
        return {k: size for k, (size, _) in self.listing(sub).items()}

    def uri(self, key: str = "") -> str:
        """Where a record of the run is, as a user reads it: `s3://<bucket>/runs/<run>/<key>`."""
        return f"s3://{self.info.name}/{self.prefix}{key}"

    # -- the manifest ---------------------------------------------------------------------------------
    # glue reads the records as their types (read_manifest, read_attempt, read_recoveries: glue.runs.records);
    # manifest(), attempt(n) and recoveries() hand out the JSON as stored, for what checks the bucket itself.
    def exists(self) -> bool:
        return self.get_bytes(layout.MANIFEST) is not None

    def manifest(self) -> dict[str, Any]:
        """The manifest's JSON as stored, its shape checked; an unknown run is one line."""
        m = self.get_json(layout.MANIFEST)
        if m is None:
            raise GlueError(f"unknown run {self.run!r}: no {self.prefix}{layout.MANIFEST} in the bucket "
                            "(list runs with `glue status --json`)")
        if not isinstance(m, dict) or not all(isinstance(m.get(k), dict) for k in MANIFEST_BLOCKS):
            raise self._not_glue(layout.MANIFEST, "a run manifest is an object with "
                                 + ", ".join(f'a "{k}" object' for k in MANIFEST_BLOCKS))
        return m

    def read_manifest(self) -> Manifest:
        """The run's manifest; an unknown run, or a manifest glue did not write, is one line."""
        return Manifest.from_dict(self.manifest(), self.run)

    def find_manifest(self) -> Any:
        """The manifest as stored, unchecked; None when there is none."""
        return self.get_json(layout.MANIFEST)

    def read_manifest_if_any(self) -> Manifest | None:
        """The manifest, None when there is none or it is no object (the scale gate reads every run's)."""
        m = self.find_manifest()
        return Manifest.from_dict(m, self.run) if isinstance(m, dict) and m else None

    def put_manifest(self, manifest: Manifest | dict[str, Any]) -> None:
        """glue deploy, once per run; a recovery onto fewer VMs records the run's new group in it."""
        self.put_json(layout.MANIFEST, manifest.to_dict() if isinstance(manifest, Manifest) else manifest)

    # -- attempts -------------------------------------------------------------------------------------

    def attempts(self) -> list[int]:
        return sorted(n for n in map(layout.attempt_of, self.keys(layout.ATTEMPTS_PREFIX)) if n is not None)

    def attempt(self, n: int) -> dict[str, Any]:
        """Attempt n's record as stored ({} when there is none); its shape checked."""
        rec = self.get_json(layout.attempt_key(n))
        if rec is None:
            return {}
        if not isinstance(rec, dict) or rec.get("attempt") != n:
            raise self._not_glue(layout.attempt_key(n), f"an attempt record is an object with \"attempt\": {n}")
        nodes = rec.get("nodes") or []
        if not isinstance(nodes, list) or not all(isinstance(nd, dict) for nd in nodes):  # each read as an AttemptNode
            raise self._not_glue(layout.attempt_key(n), "an attempt record's \"nodes\" is a list of objects")
        return rec

    def read_attempt(self, n: int) -> AttemptRecord | None:
        """Attempt n's record (None when there is none); a record glue did not write is one line."""
        rec = self.attempt(n)
        return AttemptRecord.from_dict(rec) if rec else None

    def latest_attempt(self) -> AttemptRecord | None:
        """The record of the run's newest attempt (None before its first)."""
        attempts = self.attempts()
        return self.read_attempt(attempts[-1]) if attempts else None

    def put_attempt(self, record: AttemptRecord | dict[str, Any]) -> None:
        """The attempt record, under its key (layout.attempt_key)."""
        doc = record.to_dict() if isinstance(record, AttemptRecord) else record
        self.put_json(layout.attempt_key(int(doc["attempt"])), doc)

    def put_launch(self, attempt: int, spec: dict[str, Any]) -> None:
        """A serverless attempt's launch spec (layout.launch_key), read by its execution; never a secret in it."""
        self.put_json(layout.launch_key(attempt), spec)

    def exit_record(self, n: int, node: int = 0) -> dict[str, Any] | None:
        """The supervisor's exit record of attempt n on a node (None while it runs, or when its VM died)."""
        return self.get_json(layout.exit_key(n, node))

    def errors(self, n: int) -> list[dict[str, Any]]:
        """Every rank's error files of attempt n, in key order."""
        return [e for e in (self.get_json(k) for k in sorted(self.keys(layout.errors_prefix(n)))) if e]

    def notices(self, n: int) -> list[dict[str, Any]]:
        """What every rank of attempt n did on a termination notice, in key order."""
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
        for key in sorted(self.keys(layout.METRICS_PREFIX)):
            if not layout.metrics_of_rank(key, rank):
                continue
            records += [json.loads(line) for line in (self.get_bytes(key) or b"").decode().splitlines()
                        if line.strip()]
        records += (self.get_json(layout.heartbeat_key(rank)) or {}).get("recent", [])
        for rec in records:
            if rec.get("rank", 0) == rank:
                out.setdefault(int(rec["attempt"]), {})[int(rec["step"])] = rec
        return out

    def heartbeat(self, rank: int = 0) -> dict[str, Any] | None:
        """The rank's last heartbeat (whichever attempt wrote it), or None."""
        beat = self.get_json(layout.heartbeat_key(rank))
        return beat if isinstance(beat, dict) else None

    def heartbeats(self, attempt: int) -> list[dict[str, Any]]:
        """The last heartbeat of every rank of an attempt, rank 0 first."""
        beats = []
        for key in sorted(self.keys(layout.HEARTBEATS_PREFIX)):
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
            if attempt is None or node is None:
                return k.startswith(layout.log_prefix(attempt))
            return layout.log_node(k, attempt) == node

        parts = [k for k in sorted(self.keys(layout.log_prefix(attempt))) if wanted(k)]
        return "".join((self.get_bytes(k) or b"").decode(errors="replace") for k in parts)

    # -- incidents, recoveries, evaluations -----------------------------------------------------------
    def incidents(self) -> list[dict[str, Any]]:
        """Every incident (monitor, watcher, checkpointer), oldest first."""
        return [i for i in (self.get_json(k) for k in sorted(self.keys(layout.INCIDENTS_PREFIX))) if i]

    def incident(self, key: str) -> dict[str, Any] | None:
        """One incident by the key an attempt record names (its `incident`)."""
        doc = self.get_json(key) if key.startswith(layout.INCIDENTS_PREFIX) else None
        return doc if isinstance(doc, dict) else None

    def put_incident(self, record: dict[str, Any], kind: str, at: str) -> str:
        """A new incident of class `kind` detected at `at` (ISO-8601 UTC); returns its key."""
        key = layout.incident_key(layout.key_stamp(at), kind)
        self.put_json(key, record)
        return key

    def recoveries(self) -> list[dict[str, Any]]:
        """Every recovery record as stored, in the order they were made."""
        keys = sorted(self.keys(layout.RECOVERIES_PREFIX), key=layout.recovery_number)
        return [r for r in (self.get_json(k) for k in keys) if r]

    def read_recoveries(self) -> list[RecoveryRecord]:
        """Every recovery record, in the order they were made."""
        return [RecoveryRecord.from_dict(r) for r in self.recoveries() if isinstance(r, dict)]

    def add_recovery(self, record: RecoveryRecord | dict[str, Any]) -> int:
        """The next recovery record (recoveries/<k>.json); returns k."""
        k = len(self.keys(layout.RECOVERIES_PREFIX)) + 1
        self.put_recovery(k, record)
        return k

    def put_recovery(self, k: int, record: RecoveryRecord | dict[str, Any]) -> None:
        self.put_json(layout.recovery_key(k), record.to_dict() if isinstance(record, RecoveryRecord) else record)

    def evaluations(self, last: int | None = None) -> list[dict[str, Any]]:
        """Every recorded evaluation (the `last` ones only), by attempt then step."""
        keys = sorted(self.keys(layout.EVALUATIONS_PREFIX))
        return [r for r in (self.get_json(k) for k in (keys[-last:] if last else keys)) if r]

    # -- the watcher, drills, reports, memprobe -------------------------------------------------------
    def watch_state(self) -> dict[str, Any] | None:
        doc = self.get_json(layout.WATCH_STATE)
        return doc if isinstance(doc, dict) and doc else None

    def put_watch_state(self, doc: dict[str, Any]) -> None:
        self.put_json(layout.WATCH_STATE, doc)

    def drill(self) -> dict[str, Any] | None:
        """A drill run's verdict (glue drill writes it into the drill run's prefix)."""
        doc = self.get_json(layout.DRILL)
        return doc if isinstance(doc, dict) else None

    def put_drill(self, result: dict[str, Any]) -> None:
        self.put_json(layout.DRILL, result)

    def put_report(self, page: bytes) -> str:
        """glue report's page; returns where it is."""
        self.put_bytes(layout.REPORT, page)
        return self.uri(layout.REPORT)

    def put_memprobe(self, stamp: str, report: dict[str, Any]) -> str:
        """A `glue memprobe --run` report; returns its key in the bucket (`runs/<run>/memprobe/…`)."""
        self.put_json(layout.memprobe_key(stamp), report)
        return self.prefix + layout.memprobe_key(stamp)

    def put_memprobe_snapshot(self, stamp: str, data: bytes) -> str:
        """The CUDA memory snapshot beside a memprobe report; returns its key in the bucket (the report names it)."""
        self.put_bytes(layout.memprobe_snapshot_key(stamp), data)
        return self.prefix + layout.memprobe_snapshot_key(stamp)

    # -- checkpoints under the run's prefix (its conventional checkpoint target) ----------------------
    def checkpoint_commits(self) -> dict[int, dict[str, Any]]:
        """step -> its COMMIT.json, for every committed step under runs/<run>/ckpt/."""
        out: dict[int, dict[str, Any]] = {}
        for key in sorted(self.keys(layout.CKPT_PREFIX)):
            step = layout.commit_step(key)
            if step is not None:
                out[step] = self.get_json(key) or {}
        return out

    def checkpoint_object(self, step: int, name: str) -> bytes | None:
        """One object of a step's checkpoint (name relative to its directory: layout.COMMIT, a component's)."""
        return self.get_bytes(layout.step_prefix(step) + name)

    # -- the lease (glue.runs.lease) ------------------------------------------------------------------
    def lease_entries(self, gen: int | None = None) -> dict[int, list[dict[str, Any]]]:
        """gen -> its entries ({"name", "modified": the store's LastModified}), for one generation or all."""
        out: dict[int, list[dict[str, Any]]] = {}
        for key, (_, modified) in self.listing(layout.lease_gen_prefix(gen)).items():
            entry = layout.lease_entry(key)
            if entry is not None:
                out.setdefault(entry[0], []).append({"name": entry[1], "modified": modified})
        return out

    def lease_doc(self, gen: int, name: str) -> Any:
        """An entry of generation gen (a claim, the release), by its name from lease_entries."""
        return self.get_json(layout.lease_gen_prefix(gen) + name)

    def put_lease_claim(self, gen: int, token: str, doc: dict[str, Any]) -> None:
        self.put_json(layout.lease_claim_key(gen, token), doc)

    def delete_lease_claim(self, gen: int, token: str) -> None:
        self.delete(layout.lease_claim_key(gen, token))

    def put_lease_release(self, gen: int, doc: dict[str, Any]) -> None:
        self.put_json(layout.lease_released_key(gen), doc)


def run_ids(info: BucketInfo, creds: BucketCredentials) -> list[str]:
    """The runs glue deployed: run prefixes (layout.run_prefix) with a manifest. A Checkpointer of your own
    pointed at one (no manifest) is your data, not a run to list, watch or guard."""
    s3 = bucket_store.client(info, creds)
    try:
        prefixes = [p["Prefix"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=info.name, Prefix=layout.RUNS_PREFIX, Delimiter="/") for p in page.get("CommonPrefixes", [])
            if layout.run_of_prefix(p["Prefix"]) is not None]
        # One small read per prefix not yet known as a run; a manifest is written once and glue never
        # removes it, so a run stays known (a watcher of every run lists the bucket on every poll).
        unknown = [p for p in prefixes if (info.endpoint, info.name, p) not in _KNOWN_RUNS]
        with ThreadPoolExecutor(max_workers=8) as pool:
            have = list(pool.map(lambda p: bucket_store.read(s3, info.name, p + layout.MANIFEST) is not None,
                                 unknown))
    except (ClientError, BotoCoreError) as exc:
        raise GlueError(f"bucket {info.name} at {info.endpoint} did not answer: {str(exc).splitlines()[0]}") from exc
    _KNOWN_RUNS.update((info.endpoint, info.name, p) for p, ok in zip(unknown, have, strict=True) if ok)
    return sorted(str(layout.run_of_prefix(p)) for p in prefixes if (info.endpoint, info.name, p) in _KNOWN_RUNS)


_KNOWN_RUNS: set[tuple[str, str, str]] = set()  # (endpoint, bucket, "runs/<id>/") with a manifest


def all_run_ids(home: Path) -> list[str]:
    """Every run in the cluster's bucket."""
    backend = current.backend(home)
    return run_ids(current.bucket_info(home), backend.bucket_credentials())

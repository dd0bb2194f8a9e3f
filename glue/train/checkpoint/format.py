"""The on-target format: `ckpt/step-<N>/<objects> + COMMIT.json`, validation, and incident records.

A checkpoint is valid only when COMMIT.json exists, parses, and every object it lists exists with
the listed size and sha256, and nothing else sits in the step directory. A committed checkpoint that
glue rejected (REJECTED.json beside COMMIT.json: a resume that wrote it failed the resume check, so it
continues a wrong trajectory) is invalid too; its bytes are kept.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from glue.train import layout
from glue.train.errors import ObjectMissingError
from glue.train.layout import (
    CKPT_PREFIX,
    COMMIT,
    REJECTED,
    incident_key,
    key_stamp,
    step_of_dir,
    step_prefix,
)
from glue.train.storage.target import Storage, open_target
from glue.train.utc import iso, utc_now

FORMAT = "gpukit-ckpt/1"
# COMMIT.json's list of the rank parts; the field's name is part of format gpukit-ckpt/1.
_RANK_PARTS_FIELD = "rank_manifests"
# A key within the step directory: a name, or (a sealed framework folder's files) a path of such names.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*(/[A-Za-z0-9][A-Za-z0-9_.=+-]*)*$")
READ_DEPTH = 2  # objects a deep validation downloads at once
# The objects' names on the target are glue.train.layout's (here too: the checkpoint modules use them).
object_key = layout.checkpoint_object_key
rank_part_key = layout.rank_part_key


@dataclass(frozen=True)
class ObjectRef:
    """One stored object; key is relative to the step directory. rank is None for shared state."""

    key: str
    size: int
    sha256: str
    rank: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "size": self.size, "sha256": self.sha256}
        if self.rank is not None:
            out["rank"] = self.rank
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ObjectRef:
        if not isinstance(raw, dict):
            raise ValueError("object entry is not a JSON object")
        key, size, sha = raw.get("key"), raw.get("size"), raw.get("sha256")
        if not isinstance(key, str) or not _NAME_RE.match(key) or key == COMMIT:
            raise ValueError(f"bad object key {key!r}")
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"bad size for {key}")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"bad sha256 for {key}")
        rank = raw.get("rank")
        if rank is not None and not isinstance(rank, int):
            raise ValueError(f"bad rank for {key}")
        return cls(key, size, sha, rank)


@dataclass
class Commit:
    """The parsed COMMIT.json."""

    step: int
    created_at: str
    world_size: int
    components: dict[str, list[ObjectRef]]
    rank_parts: list[ObjectRef] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)
    # Components saved through DCP: one object per saving rank (its chunks and their DCP metadata).
    sharded: list[str] = field(default_factory=list)

    def objects(self) -> list[ObjectRef]:
        return [o for objs in self.components.values() for o in objs] + list(self.rank_parts)

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "step": self.step,
            "created_at": self.created_at,
            "world_size": self.world_size,
            "components": {n: [o.as_json() for o in objs] for n, objs in self.components.items()},
            _RANK_PARTS_FIELD: [o.as_json() for o in self.rank_parts],
            "timings": self.timings,
        }
        if self.sharded:
            body["sharded"] = self.sharded
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, step: int) -> Commit:
        """Raise ValueError (one line) for anything that is not a complete commit for `step`."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"COMMIT.json is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"COMMIT.json is not a {FORMAT} commit")
        if raw.get("step") != step:
            raise ValueError(f"COMMIT.json says step {raw.get('step')!r}, directory says {step}")
        comps = raw.get("components")
        if not isinstance(comps, dict) or not comps:
            raise ValueError("COMMIT.json lists no components")
        ws = raw.get("world_size")
        if not isinstance(ws, int) or ws < 1:
            raise ValueError("COMMIT.json has no valid world_size")
        components = {}
        for name, objs in comps.items():
            if not isinstance(objs, list) or not objs:
                raise ValueError(f"component {name!r} lists no objects")
            components[str(name)] = [ObjectRef.from_json(o) for o in objs]
        parts = [ObjectRef.from_json(o) for o in raw.get(_RANK_PARTS_FIELD, [])]
        timings = raw["timings"] if isinstance(raw.get("timings"), dict) else {}
        sharded = raw.get("sharded", [])
        if not isinstance(sharded, list) or any(n not in components for n in sharded):
            raise ValueError("COMMIT.json's sharded list names components it does not list")
        for name in sharded:
            if sorted(o.rank for o in components[name] if o.rank is not None) != list(range(ws)):
                raise ValueError(f"sharded component {name!r} does not list one object per rank of {ws}")
        return cls(step, str(raw.get("created_at", "")), ws, components, parts, timings, [str(n) for n in sharded])


@dataclass
class Problem:
    object: str  # key relative to the target root
    what: str


@dataclass
class CheckpointStatus:
    """What validation found for one step directory."""

    step: int
    valid: bool
    problems: list[Problem] = field(default_factory=list)
    commit: Commit | None = None
    bytes: int = 0
    download_s: float = 0.0


def list_steps(storage: Storage) -> dict[int, dict[str, int]]:
    """step -> {key relative to the step directory: size} for every `ckpt/step-<N>/` on the target."""
    out: dict[int, dict[str, int]] = {}
    for key, size in storage.list(CKPT_PREFIX).items():
        parts = key.split("/")
        if len(parts) < 3 or parts[0] + "/" != CKPT_PREFIX:
            continue
        step = step_of_dir(parts[1])
        if step is not None:
            out.setdefault(step, {})["/".join(parts[2:])] = size
    return out


def list_step(storage: Storage, step: int) -> dict[str, int]:
    """{key relative to the step directory: size} for one step."""
    prefix = step_prefix(step)
    return {k[len(prefix) :]: v for k, v in storage.list(prefix).items() if k.startswith(prefix)}


def validate_step(
    storage: Storage,
    step: int,
    listing: dict[str, int],
    *,
    deep: bool = True,
    keep: Callable[[ObjectRef], bool] | None = None,
    blobs: dict[str, bytearray] | None = None,
) -> CheckpointStatus:
    """Check one step. deep=True reads every object back and compares sha256; objects for which
    keep(ref) is true are stored into `blobs` (so restore does not download them twice)."""
    prefix = step_prefix(step)
    status = CheckpointStatus(step=step, valid=False)
    commit = _read_commit(storage, prefix, listing, status)
    if commit is None:
        return status
    status.commit = commit
    _check_listing(commit, listing, prefix, status)
    if status.problems or not deep:
        status.valid = not status.problems
        return status
    status.valid = _read_back(storage, prefix, commit, status, keep, blobs)
    return status


def _bad(status: CheckpointStatus, prefix: str, key: str, what: str) -> bool:
    status.problems.append(Problem(prefix + key, what))
    return False


def _read_commit(storage: Storage, prefix: str, listing: dict[str, int], status: CheckpointStatus) -> Commit | None:
    """The step's COMMIT.json, or None (and the problem added to status) when it is rejected, missing or unreadable."""
    if REJECTED in listing:
        _bad(status, prefix, REJECTED, f"rejected: {_rejected_why(storage, prefix + REJECTED, listing[REJECTED])}")
        return None
    if COMMIT not in listing:
        _bad(status, prefix, COMMIT, "COMMIT.json is missing (partial or interrupted save)")
        return None
    try:
        data, _ = storage.get(prefix + COMMIT, listing[COMMIT])
    except ObjectMissingError:
        _bad(status, prefix, COMMIT, "COMMIT.json disappeared while reading (pruned concurrently?)")
        return None
    try:
        return Commit.parse(bytes(data), status.step)
    except ValueError as exc:
        _bad(status, prefix, COMMIT, str(exc))
        return None


def _check_listing(commit: Commit, listing: dict[str, int], prefix: str, status: CheckpointStatus) -> None:
    """The listing against COMMIT.json: no stray object, none missing, every size as committed."""
    listed = {o.key for o in commit.objects()}
    for key in sorted(set(listing) - listed - {COMMIT}):
        _bad(status, prefix, key, "stray object not listed in COMMIT.json")
    for ref in commit.objects():
        if ref.key not in listing:
            _bad(status, prefix, ref.key, "listed in COMMIT.json but missing")
        elif listing[ref.key] != ref.size:
            _bad(status, prefix, ref.key,
                 f"size {listing[ref.key]} != {ref.size} in COMMIT.json (truncated or overwritten)")


def _read_back(storage: Storage, prefix: str, commit: Commit, status: CheckpointStatus,
               keep: Callable[[ObjectRef], bool] | None, blobs: dict[str, bytearray] | None) -> bool:
    """Every object downloaded and its size and sha256 checked; False at the first problem (added to status)."""
    refs = iter(commit.objects())
    fetching: deque[tuple[ObjectRef, Future[tuple[bytearray, str]]]] = deque()
    t0 = time.monotonic()
    # READ_DEPTH objects download at once (each in parallel parts); they are checked in COMMIT.json's
    # order, so the problem reported does not depend on which download finished first.
    with ThreadPoolExecutor(max_workers=READ_DEPTH, thread_name_prefix="gpukit-ckpt-read") as pool:

        def fetch_next() -> None:
            ref = next(refs, None)
            if ref is not None:
                fetching.append((ref, pool.submit(storage.get, prefix + ref.key, ref.size)))

        try:
            for _ in range(READ_DEPTH):
                fetch_next()
            while fetching:
                ref, fut = fetching.popleft()
                try:
                    body, sha = fut.result()
                except ObjectMissingError:
                    return _bad(status, prefix, ref.key, "listed in COMMIT.json but missing")
                fetch_next()
                status.bytes += len(body)
                if len(body) != ref.size:
                    return _bad(status, prefix, ref.key, f"read {len(body)} bytes, COMMIT.json says {ref.size}")
                if sha != ref.sha256:
                    return _bad(status, prefix, ref.key,
                                f"sha256 {sha[:12]}… != {ref.sha256[:12]}… in COMMIT.json (corrupted)")
                if keep is not None and blobs is not None and keep(ref):
                    blobs[ref.key] = body
                del body
        finally:
            for _, pending in fetching:
                pending.cancel()  # after a problem: what has not started never will
            status.download_s = time.monotonic() - t0
    return True


def _rejected_why(storage: Storage, key: str, size: int) -> str:
    try:
        data, _ = storage.get(key, size)
        why = json.loads(bytes(data)).get("why")
    except (ObjectMissingError, ValueError, AttributeError):
        why = None
    return str(why or "marked by glue")


def reject(storage: Storage, steps: list[int], why: str, by: str) -> list[int]:
    """Mark committed checkpoints as not to be resumed from (REJECTED.json); nothing is deleted. Restore
    and prune then treat them as invalid: moved aside to ckpt-invalid/ for inspection, never resumed."""
    listing = list_steps(storage)
    done: list[int] = []
    for s in sorted(steps):
        if COMMIT in listing.get(s, {}) and REJECTED not in listing[s]:
            body = {"step": s, "why": why, "by": by, "at": iso(utc_now())}
            storage.put(step_prefix(s) + REJECTED, (json.dumps(body, indent=1) + "\n").encode())
            done.append(s)
    return done


def newest_valid(storage: Storage, *, deep: bool = True) -> CheckpointStatus | None:
    """The newest valid checkpoint, validated newest first: an older one is never read once a newer one is
    valid (deep, each read is the whole checkpoint, and a run keeps several). None when none is valid."""
    steps = list_steps(storage)
    for step in sorted(steps, reverse=True):
        if (status := validate_step(storage, step, steps[step], deep=deep)).valid:
            return status
    return None


def check_checkpoints(storage: Storage, *, deep: bool = True) -> list[CheckpointStatus]:
    """Every step directory on the target, newest first, each validated (deep: sha256 of all objects)."""
    steps = list_steps(storage)
    return [validate_step(storage, s, steps[s], deep=deep) for s in sorted(steps, reverse=True)]


def record_incident(
    storage: Storage, status: CheckpointStatus, fell_back_to: int | None, rank: int, target: str
) -> str:
    """Write `incidents/<UTC-ts>-ckpt_corrupt.json` (`ckpt_rejected` for a rejected one); return its key."""
    now = utc_now()
    first = status.problems[0] if status.problems else Problem(step_prefix(status.step), "invalid")
    kind = "ckpt_rejected" if first.object.endswith("/" + REJECTED) else "ckpt_corrupt"
    body = {
        "class": kind,
        "at": iso(now),
        "target": target,
        "step": status.step,
        "object": first.object,
        "what": first.what,
        "problems": [{"object": p.object, "what": p.what} for p in status.problems],
        "fell_back_to": fell_back_to,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    key = incident_key(key_stamp(iso(now)), kind)
    storage.put(key, (json.dumps(body, indent=1) + "\n").encode())
    return key


def validate_checkpoints(target: str, *, deep: bool = True, **target_args: object) -> list[CheckpointStatus]:
    """List and validate every checkpoint under a target (`glue recover` uses this), newest first."""
    return check_checkpoints(open_target(target, **target_args), deep=deep)  # type: ignore[arg-type]

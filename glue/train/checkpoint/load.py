"""From a checkpoint's objects to component states: fetching and verifying every object of a step
while the verified ones are already deserialized, which object is this rank's, how it is
deserialized, and in which order states go into the live objects (the model last, so an error in
any other component leaves the model untouched)."""

from __future__ import annotations

import inspect
import pickle
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, cast

import torch

from glue.train.checkpoint.format import CheckpointStatus, Commit, ObjectRef, Problem, step_prefix
from glue.train.errors import CheckpointError, ObjectMissingError, StateMismatchError
from glue.train.storage.buffers import BlobReader
from glue.train.storage.target import Storage

FETCH_DEPTH = 2  # objects in flight at once; each moves in parallel parts (the storage's own pool)


def pick_object(commit: Commit, name: str, *, per_rank: bool, rank: int, world_size: int) -> ObjectRef:
    """The object holding component `name` for this rank; StateMismatchError if there is none."""
    refs = commit.components.get(name)
    if refs is None:
        have = ", ".join(sorted(commit.components))
        raise StateMismatchError(name, "", f"not in the checkpoint of step {commit.step} (it has: {have})")
    want_rank = rank if per_rank else None
    ref = next((r for r in refs if r.rank == want_rank), None)
    if ref is None:
        what = (
            f"no state for rank {rank}: saved with world_size {commit.world_size}, this run has {world_size}"
            if per_rank
            else "saved per rank in the checkpoint but registered as shared here"
        )
        raise StateMismatchError(name, f"rank{rank}" if per_rank else "", what)
    if per_rank and commit.world_size != world_size:
        # Refused on every rank, not only on those without a state of their own: a rank that restored
        # alone would wait forever for the others (and each rank's data position assumes the old split).
        raise StateMismatchError(name, "world_size", f"saved with world_size {commit.world_size}, this run has "
                                                     f"{world_size}; a resume needs the same world size")
    return ref


def deserialize(name: str, ref: ObjectRef, body: bytes | bytearray, *, weights_only: bool) -> Any:
    """torch.load an object already in memory. Its tensors are views of `body` where the installed
    torch allows it (see _load_in_place), else copies read from it in place."""
    try:
        if weights_only and isinstance(body, bytearray) and _IN_PLACE:
            return _load_in_place(body)
        return torch.load(cast(IO[bytes], BlobReader(body)), map_location="cpu", weights_only=weights_only)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        hint = "; if it holds custom Python objects, use weights_only=False" if weights_only else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint component {name!r}: cannot load {ref.key}: {first}{hint}") from exc


def _in_place_supported() -> bool:
    ser = torch.serialization
    load = getattr(ser, "_load", None)
    return (
        load is not None
        and "overall_storage" in inspect.signature(load).parameters
        and callable(getattr(ser, "_open_zipfile_reader", None))
        and getattr(ser, "_weights_only_unpickler", None) is not None
    )


_IN_PLACE = _in_place_supported()


def _load_in_place(body: bytearray) -> Any:
    """torch.load(weights_only=True) whose tensors are views of `body`, as torch.load(mmap=True) makes
    them views of a mapped file: no second allocation, page-faulting and copy of every byte (for a
    500 MB state about as long as its download on a small VM). torch offers that only for a file
    path, so this calls the same internal loader with the buffer as the "mapped" storage. The views
    keep `body` alive; the optimizer's state then lives in it (the model's is copied into the
    parameters). A checkpoint is always a zip (torch.save's default format)."""
    ser = cast(Any, torch.serialization)
    storage = torch.frombuffer(body, dtype=torch.uint8).untyped_storage()
    with ser._open_zipfile_reader(BlobReader(body)) as zf:
        return ser._load(zf, "cpu", ser._weights_only_unpickler, overall_storage=storage, encoding="utf-8")


class StepFetch:
    """Deep validation of one step fused with deserialization: every object the COMMIT lists is
    downloaded (FETCH_DEPTH at a time, in COMMIT.json order) and its size and sha256 checked; each
    verified object this rank loads is deserialized at once on a separate thread while the others
    still download. Nothing here touches a live component."""

    def __init__(
        self,
        storage: Storage,
        status: CheckpointStatus,
        wanted: Mapping[str, str],
        loader: ThreadPoolExecutor,
        *,
        weights_only: bool,
    ) -> None:
        self.storage = storage
        self.status = status
        self.wanted = wanted  # object key -> component name
        self._loader = loader
        self.weights_only = weights_only
        self.states: dict[str, Future[Any]] = {}  # object key -> its deserialized state

    def run(self) -> CheckpointStatus:
        """Fill status (valid, problems, bytes, download_s). A problem stops new downloads; those
        already running are checked too, so the problem reported is the first in COMMIT.json order
        whichever download finished first."""
        status = self.status
        assert status.commit is not None
        prefix = step_prefix(status.step)
        refs = iter(status.commit.objects())
        found: dict[int, Problem] = {}
        fetching: deque[tuple[int, ObjectRef, Future[tuple[bytearray, str]]]] = deque()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=FETCH_DEPTH, thread_name_prefix="gpukit-ckpt-read") as pool:
            order = 0

            def fetch_next() -> None:
                nonlocal order
                ref = next(refs, None)
                if ref is not None:
                    fetching.append((order, ref, pool.submit(self.storage.get, prefix + ref.key, ref.size)))
                    order += 1

            try:
                for _ in range(FETCH_DEPTH):
                    fetch_next()
                while fetching:
                    i, ref, fut = fetching.popleft()
                    what = self._check(ref, fut)
                    if what is not None:
                        found[i] = Problem(prefix + ref.key, what)
                    elif not found:
                        fetch_next()
            finally:
                for _, _, pending in fetching:
                    pending.cancel()  # only after a storage error: what has not started never will
                status.download_s = time.monotonic() - t0
        if found:
            status.problems.append(found[min(found)])
            status.valid = False
            self.states.clear()
        else:
            status.valid = True
        return status

    def _check(self, ref: ObjectRef, fut: Future[tuple[bytearray, str]]) -> str | None:
        """The problem with one object, or None once it is verified (and, if wanted, queued to load)."""
        try:
            body, sha = fut.result()
        except ObjectMissingError:
            return "listed in COMMIT.json but missing"
        self.status.bytes += len(body)
        if len(body) != ref.size:
            return f"read {len(body)} bytes, COMMIT.json says {ref.size}"
        if sha != ref.sha256:
            return f"sha256 {sha[:12]}… != {ref.sha256[:12]}… in COMMIT.json (corrupted)"
        name = self.wanted.get(ref.key)
        if name is not None:
            self.states[ref.key] = self._loader.submit(deserialize, name, ref, body, weights_only=self.weights_only)
        return None


def load_priority(obj: object) -> int:
    """Sort key: components we cannot validate fully load first, the model last."""
    if isinstance(obj, torch.nn.Module):
        return 3
    if isinstance(obj, torch.optim.Optimizer):
        return 2
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return 1
    return 0

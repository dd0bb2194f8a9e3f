"""A framework's own checkpoint folder made a gpukit checkpoint ("sealed"): Hugging Face Trainer's
`checkpoint-<N>/`, a Lightning `.ckpt`, any folder of files.

`seal(step, folder)` uploads every file as is to `ckpt/step-<N>/files/<path>`, reads each back against
its size and sha256, and writes COMMIT.json (listing them all) last; older sealed steps beyond keep_last
are pruned after it. `fetch(dest)` finds the newest valid one (every sha256 checked; torn or interrupted
ones skipped, each with an incident), downloads it into `dest/<folder name>` and returns the path to
hand the framework's resume call (`resume_from_checkpoint=`, `ckpt_path=`).
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from glue.train.checkpoint import invalid
from glue.train.checkpoint.commit import IO_DEPTH, commit_files, prune
from glue.train.checkpoint.format import CheckpointStatus, Commit, list_steps, validate_step
from glue.train.errors import CheckpointError, SaveFailedError
from glue.train.storage import mount_config
from glue.train.storage.s3_client import CredentialsCallback
from glue.train.storage.target import Storage, open_target

log = logging.getLogger("glue.train")
FILES = "files"  # the component that lists a sealed folder's files
NAME = "folder.json"  # what the folder was called, and the file that is the checkpoint when it is one file


@dataclass
class Fetched:
    step: int
    path: Path
    skipped: list[CheckpointStatus]


class FolderCheckpoints:
    """Sealed framework checkpoints under a target (`s3://bucket/prefix`, a folder, or under /mnt/s3)."""

    def __init__(self, target: str | os.PathLike[str], *, keep_last: int = 2, storage: Storage | None = None,
                 endpoint_url: str | None = None, credentials: CredentialsCallback | None = None,
                 region: str | None = None) -> None:
        if keep_last < 2:
            raise CheckpointError(f"keep_last must be at least 2 (got {keep_last}): the previous one is the fallback")
        opened: str | os.PathLike[str] = target
        if storage is None and endpoint_url is None and credentials is None:
            opened, endpoint_url, credentials, region = mount_config.resolve(os.fspath(target), region)
        self.storage = storage or open_target(opened, endpoint_url=endpoint_url, credentials=credentials,
                                              region=region)
        self.keep_last = keep_last
        self._io = ThreadPoolExecutor(max_workers=IO_DEPTH, thread_name_prefix="gpukit-seal")
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpukit-seal-commit")
        self._inflight: tuple[int, Future[Commit]] | None = None

    def close(self) -> None:
        """Wait for a seal still in flight (raises if it failed), then stop the threads."""
        try:
            self.flush()
        finally:
            self._background.shutdown(wait=True)
            self._io.shutdown(wait=True)

    def seal(self, step: int, path: str | os.PathLike[str]) -> Commit:
        """Make the folder (or single file) at `path` the checkpoint of `step`; returns its commit."""
        self.flush()
        return self._commit(step, self._read(Path(path)))

    def seal_async(self, step: int, path: str | os.PathLike[str]) -> None:
        """seal(), with only the reading of the files on the caller's thread (the framework may rotate
        its folders away later): the upload, verify and commit run in the background. At most one is in
        flight: the next seal waits for it and raises SaveFailedError if it failed."""
        self.flush()
        body = self._read(Path(path))
        self._inflight = (step, self._background.submit(self._commit, step, body))

    def flush(self) -> None:
        """Until the seal in flight is committed; SaveFailedError if it failed."""
        if self._inflight is None:
            return
        step, fut = self._inflight
        self._inflight = None
        exc = fut.exception()
        if exc is not None:
            raise SaveFailedError(step, exc) from exc

    def _read(self, src: Path) -> list[tuple[str, bytes]]:
        if src.is_file():
            files = [(src.name, src)]
        elif src.is_dir():
            files = sorted((p.relative_to(src).as_posix(), p) for p in src.rglob("*") if p.is_file())
        else:
            raise CheckpointError(f"nothing to seal at {src}: no such file or folder")
        if not files:
            raise CheckpointError(f"nothing to seal at {src}: the folder is empty")
        body = [(f"{FILES}/{rel}", p.read_bytes()) for rel, p in files]
        body.append((NAME, json.dumps({"name": src.name, "file": src.is_file()}).encode()))
        return body

    def _commit(self, step: int, body: list[tuple[str, bytes]]) -> Commit:
        commit = commit_files(self.storage, step, FILES, body, self._io, {})
        prune(self.storage, step, keep_last=self.keep_last, stale_steps=set())
        log.info("sealed checkpoint step %d in %s", step, self.storage.describe())
        return commit

    def latest_valid(self) -> int | None:
        steps = list_steps(self.storage)
        return next((s for s in sorted(steps, reverse=True)
                     if validate_step(self.storage, s, steps[s], deep=True).valid), None)

    def fetch(self, dest: str | os.PathLike[str]) -> Fetched | None:
        """The newest valid sealed checkpoint, downloaded into `dest`; None when there is none. Invalid
        newer ones are skipped with an incident each (a corrupt one is moved aside to ckpt-invalid/)."""
        steps = list_steps(self.storage)
        skipped: list[CheckpointStatus] = []
        for s in sorted(steps, reverse=True):
            blobs: dict[str, bytearray] = {}
            status = validate_step(self.storage, s, steps[s], deep=True, keep=lambda ref: True, blobs=blobs)
            if not status.valid or status.commit is None or FILES not in status.commit.components:
                log.warning("sealed checkpoint step %d is not valid: %s", s,
                            "; ".join(p.what for p in status.problems[:2]) or "not a sealed folder")
                skipped.append(status)
                continue
            invalid.record_skipped(self.storage, skipped, steps, s, 0, move=True)
            return Fetched(s, self._write(Path(dest), s, blobs), skipped)
        invalid.record_skipped(self.storage, skipped, steps, None, 0, move=True)
        return None

    def _write(self, dest: Path, step: int, blobs: dict[str, bytearray]) -> Path:
        about = json.loads(bytes(blobs.pop(NAME, bytearray(b"{}"))) or b"{}")
        name = str(about.get("name") or f"checkpoint-{step}")
        if "/" in name or name in (".", ".."):
            raise CheckpointError(f"sealed checkpoint step {step} names its folder {name!r}")
        if about.get("file"):
            out = dest / name
            dest.mkdir(parents=True, exist_ok=True)
            out.write_bytes(blobs[f"{FILES}/{name}"])
            return out
        root = dest / name
        for key, data in blobs.items():
            rel = key.removeprefix(f"{FILES}/")
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return root

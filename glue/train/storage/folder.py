"""A checkpoint target that is a directory: local disk, or the bucket mounted at /mnt/s3.

Writes go in place and are fsynced, file and directory, because COMMIT.json may only refer to
objects that are durable; nothing is renamed (renames silently fail on some FUSE mounts). A path
under /mnt/s3 is refused while nothing is mounted there: it would land on the VM's ephemeral disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from glue.train.errors import ObjectMissingError, TargetError
from glue.train.storage.retry import RetryPolicy, Transient, with_retry

T = TypeVar("T")
_READ_CHUNK = 4 * 1024 * 1024


class FileStorage:
    """A directory (local disk, or the bucket mounted at /mnt/s3). Writes in place, fsyncs, no renames."""

    def __init__(self, root: Path, retry: RetryPolicy | None = None) -> None:
        self.root = root
        self.retry = retry or RetryPolicy()

    def describe(self) -> str:
        return str(self.root)

    def check(self) -> None:
        # A path under /mnt/s3 that is not mounted would silently land on the VM's ephemeral disk.
        for parent in [self.root, *self.root.parents]:
            if str(parent) == "/mnt/s3" and not os.path.ismount(parent):
                raise TargetError(f"{self.root} is under /mnt/s3 but the bucket is not mounted there")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TargetError(f"cannot create checkpoint directory {self.root}: {exc.strerror}") from exc

    def _path(self, key: str) -> Path:
        return self.root / key

    def _fs(self, what: str, op: Callable[[], T]) -> T:
        def attempt() -> T:
            try:
                return op()
            except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
                raise
            except OSError as exc:
                raise Transient(f"{exc.strerror or exc}") from exc

        return with_retry(what, attempt, self.retry)

    def put(self, key: str, data: bytes | bytearray) -> None:
        path = self._path(key)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            # The directory entry must be durable before anything that refers to it (COMMIT.json).
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            except OSError:
                pass  # some FUSE filesystems do not support fsync on directories
            finally:
                os.close(dfd)

        try:
            self._fs(f"write {path}", write)
        except PermissionError as exc:
            raise TargetError(f"cannot write {path}: permission denied") from exc

    def get(self, key: str, size_hint: int | None = None) -> tuple[bytearray, str]:
        path = self._path(key)

        def read() -> tuple[bytearray, str]:
            sha = hashlib.sha256()
            with open(path, "rb", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                buf = bytearray(size)
                got = 0
                with memoryview(buf) as view:
                    while got < size:
                        n = fh.readinto(view[got : min(size, got + _READ_CHUNK)])
                        if not n:
                            break
                        sha.update(view[got : got + n])  # hashed while still in the CPU cache
                        got += n
                del buf[got:]  # the file shrank while it was read
            return buf, sha.hexdigest()

        try:
            return self._fs(f"read {path}", read)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectMissingError(key) from exc

    def list(self, prefix: str = "") -> dict[str, int]:
        base = self._path(prefix) if prefix else self.root
        out: dict[str, int] = {}

        def walk() -> dict[str, int]:
            out.clear()
            if not base.exists():
                return out
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    full = Path(dirpath) / name
                    try:
                        out[full.relative_to(self.root).as_posix()] = full.stat().st_size
                    except FileNotFoundError:
                        continue  # deleted while we walked
            return out

        return self._fs(f"list {base}", walk)

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)

            def unlink(path: Path = path) -> None:
                path.unlink(missing_ok=True)

            self._fs(f"delete {path}", unlink)
            parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root and self.root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break  # not empty (or already gone): stop climbing
                parent = parent.parent

"""Object bodies in memory, hashed as they are written and read without copies.

Every checkpoint object is listed in COMMIT.json with its sha256, so every byte written or read is
hashed. Hashing while the bytes stream through (instead of a second pass over hundreds of MB) and
avoiding intermediate copies is most of what separates a verified transfer from a raw one.
"""

from __future__ import annotations

import hashlib
import io
import threading
from typing import Any


class HashingWriter(io.RawIOBase):
    """A write-only target for torch.save: appends to one buffer and hashes each write as it comes."""

    def __init__(self) -> None:
        super().__init__()
        self._buf = bytearray()
        self._sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._buf += data
        self._sha.update(data)
        return memoryview(data).nbytes

    def result(self) -> tuple[bytearray, str]:
        """The bytes written and their sha256 (hex)."""
        return self._buf, self._sha.hexdigest()


class HashingSink:
    """A seekable download target for parallel ranged GETs (s3transfer writes each part in place, from
    one thread). Parts land directly in one buffer, preallocated when the size is known; the sha256
    advances over the contiguous prefix as it fills, so hashing ends with the download.

    Bytes that are never written read as zeros, so a gap can only make the sha256 disagree.
    """

    def __init__(self, size_hint: int | None = None) -> None:
        self._buf = bytearray(size_hint or 0)
        self._pos = 0
        self._end = 0  # one past the highest byte written
        self._hashed = 0  # [0, _hashed) is in the sha256
        self._runs: dict[int, int] = {}  # written but not yet hashed: start -> end
        self._sha = hashlib.sha256()

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._end}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        start, end = self._pos, self._pos + len(view)
        if start > len(self._buf):
            self._buf.extend(bytes(start - len(self._buf)))  # a later part came first and no size was known
        if end <= len(self._buf):
            self._buf[start:end] = view
        else:
            self._buf[start:] = view  # grows the buffer (the size hint was short)
        self._pos = end
        self._end = max(self._end, end)
        if end > self._hashed:
            if start <= self._hashed:
                self._hash_to(end)
            else:
                self._runs[start] = max(end, self._runs.get(start, end))
        return len(view)

    @property
    def hashed_bytes(self) -> int:
        """How far the sha256 has got: all of it, once every byte up to the end has arrived."""
        return self._hashed

    def _hash_to(self, end: int) -> None:
        while True:
            with memoryview(self._buf) as mv:
                self._sha.update(mv[self._hashed : end])
            self._hashed = end
            nxt = self._runs.pop(end, None)
            if nxt is None:
                return
            end = max(nxt, end)

    def result(self) -> tuple[bytearray, str]:
        """The bytes received and their sha256 (hex)."""
        if self._hashed < self._end:
            self._hash_to(self._end)  # only after a gap; its zeros make the sha256 disagree
        self._runs.clear()
        del self._buf[self._end :]
        return self._buf, self._sha.hexdigest()


class PartSink:
    """A download target of known size filled by several threads at once, each writing its own byte
    range straight into one preallocated buffer (socket -> buffer, no intermediate bytes object).

    Writers report each filled range with filled(); the sha256 follows the contiguous filled prefix.
    Whichever writer extends that prefix hashes it, outside the lock (hashlib releases the GIL on
    large updates), so hashing overlaps the other parts' downloads and ends soon after the last byte.
    """

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self._lock = threading.Lock()
        self._sha = hashlib.sha256()
        self._hashed = 0  # [0, _hashed) is in the sha256 (or being added by the hashing writer)
        self._runs: dict[int, int] = {}  # filled but not yet hashed: start -> end
        self._hashing = False

    def filled(self, start: int, end: int) -> None:
        """[start, end) holds its final bytes; never report a range twice."""
        with self._lock:
            if end > start:
                self._runs[start] = end
            if self._hashing:
                return  # the writer that is hashing picks this run up when it gets there
            self._hashing = True
        try:
            while True:
                with self._lock:
                    begin = stop = self._hashed
                    while stop in self._runs:
                        stop = self._runs.pop(stop)
                    if stop == begin:
                        self._hashing = False
                        return
                self._sha.update(self.view[begin:stop])
                with self._lock:
                    self._hashed = stop
        except BaseException:
            with self._lock:
                self._hashing = False
            raise

    @property
    def hashed_bytes(self) -> int:
        return self._hashed

    def result(self) -> tuple[bytearray, str]:
        """The buffer and its sha256. A range never reported stays out of the hash, so the sha256 can
        only disagree with the one expected."""
        self.view = memoryview(b"")  # drop the export, so the caller owns a plain bytearray
        return self.buf, self._sha.hexdigest()


class BlobReader(io.RawIOBase):
    """A seekable reader over bytes already in memory, without the copy io.BytesIO(bytearray) makes
    (torch.load of a 500 MB object is about twice as fast this way; uploads read their parts here)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        out = self._view[self._pos : end].tobytes()
        self._pos = max(self._pos, end)
        return out

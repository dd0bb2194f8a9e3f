"""Object bodies held in memory, read without copies."""

from __future__ import annotations

import io
from typing import Any


class BlobReader(io.RawIOBase):
    """A seekable reader over bytes already in memory, without the copy io.BytesIO(bytearray) makes
    (torch.load of a 500 MB object is about twice as fast this way)."""

    def __init__(self, data: bytes | bytearray) -> None:
        super().__init__()
        self._view = memoryview(data)
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

"""The workdir as one deterministic tar: sorted paths, times 0, owner 0, modes 0644/0755. The same
tree gives the same bytes, so the tar's sha256 is the code's content address."""

from __future__ import annotations

import hashlib
import os
import queue
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from glue.errors import GlueError
from glue.workdir import tarheader
from glue.workdir.select import Selection

MIB = 1 << 20
LARGEST_SHOWN = 3
CHUNK = 1 << 20



@dataclass
class Package:
    """A packed workdir: the tar in a temporary file (deleted with `close()`), its hash, what it holds."""

    path: Path
    sha256: str
    size: int
    files: list[tuple[str, int]]  # (path, size): files and links, sorted

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def index(self) -> dict[str, object]:
        return {"sha256": self.sha256, "size": self.size, "files": [{"path": p, "size": s} for p, s in self.files]}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mode(st: os.stat_result) -> int:
    return 0o755 if st.st_mode & 0o111 else 0o644


def check_size(sel: Selection, cap_mb: int) -> dict[str, os.stat_result]:
    """Each file's stat (read once, for the size check and the header); over the cap is refused naming
    the largest files."""
    stats = {rel: (sel.root / rel).lstat() for rel in [*sel.files, *sel.links]}
    total = sum(st.st_size for rel, st in stats.items() if rel not in sel.links)
    if total > cap_mb * MIB:
        sizes = sorted(((r, st.st_size) for r, st in stats.items()), key=lambda x: -x[1])[:LARGEST_SHOWN]
        largest = ", ".join(f"{r} ({n / MIB:.1f} MiB)" for r, n in sizes)
        raise GlueError(f"workdir {sel.root} holds {total / MIB:.1f} MiB, over the {cap_mb} MiB cap "
                        f"(workdir.max_size_mb); largest: {largest}. Ignore data and outputs in .gpukitignore "
                        "(data belongs in the bucket), or raise workdir.max_size_mb")
    return stats


class _Sink:
    """The tar being written: every byte counted on its way to the file and hashed by a second thread
    (hashlib lets go of the GIL on large buffers), so hashing overlaps reading and writing."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.h, self.n = fh, hashlib.sha256(), 0
        self.pending = bytearray()
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=32)
        self.hasher = threading.Thread(target=self._hash, name="gpukit-pack-sha256", daemon=True)
        self.hasher.start()

    def _hash(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            self.h.update(chunk)

    def write(self, data: bytes) -> None:
        self.fh.write(data)
        self.n += len(data)
        if not self.pending and len(data) >= CHUNK:
            self.chunks.put(data)
            return
        self.pending += data  # headers and paddings: batched, in order
        if len(self.pending) >= CHUNK:
            self.chunks.put(bytes(self.pending))
            self.pending = bytearray()

    def hexdigest(self) -> str:
        if self.pending:
            self.chunks.put(bytes(self.pending))
            self.pending = bytearray()
        self.chunks.put(None)
        self.hasher.join()
        return self.h.hexdigest()

    def file(self, path: str, head: bytes, size: int) -> None:
        """Header, the file's bytes, padding to the tar block: one write for a small file. The file must
        still be the size its header says."""
        pad = b"\0" * (-size % tarfile.BLOCKSIZE)
        with open(path, "rb") as fh:
            if size <= CHUNK:
                data = fh.read(size + 1)
                got = len(data)
                if got == size:
                    self.write(head + data + pad)
            else:
                self.write(head)
                got = 0
                while chunk := fh.read(CHUNK):
                    self.write(chunk)
                    got += len(chunk)
                self.write(pad)
        if got != size:
            raise GlueError(f"workdir: {path} changed while it was packed ({size} bytes, then {got}); deploy again")


def pack(sel: Selection, cap_mb: int) -> Package:
    """Tar the selected files (refusing secret-looking ones and an oversized tree first). Headers come from
    tarfile (GNU format: long names too); the bytes are copied here, hashed on the way (tarfile's own
    16 KiB copy loop was most of the time)."""
    if sel.refused:
        more = f" (and {len(sel.refused) - 1} more: {', '.join(sel.refused[1:4])})" if sel.refused[1:] else ""
        raise GlueError(f"workdir: {sel.refused[0]} looks like a secret{more}"
                        + "; ignore it in .gpukitignore, or list it under workdir.secret_files to ship it on purpose")
    stats = check_size(sel, cap_mb)
    links = set(sel.links)
    root = str(sel.root)
    fd, name = tempfile.mkstemp(prefix="gpukit-workdir-", suffix=".tar")
    listed: list[tuple[str, int]] = []
    sink: _Sink | None = None
    try:
        with os.fdopen(fd, "wb", buffering=CHUNK) as raw:
            sink = _Sink(raw)
            for rel in sorted(stats):
                st = stats[rel]
                if rel in links:
                    sink.write(tarheader.header(rel, 0, 0o777, os.readlink(os.path.join(root, rel))))
                    listed.append((rel, 0))
                    continue
                sink.file(os.path.join(root, rel), tarheader.header(rel, st.st_size, _mode(st)), st.st_size)
                listed.append((rel, st.st_size))
            sink.write(b"\0" * (2 * tarfile.BLOCKSIZE))  # end of archive, then a whole record, as tar writes it
            if sink.n % tarfile.RECORDSIZE:
                sink.write(b"\0" * (tarfile.RECORDSIZE - sink.n % tarfile.RECORDSIZE))
        return Package(Path(name), sink.hexdigest(), sink.n, listed)
    except (OSError, GlueError) as exc:
        if sink is not None:
            sink.hexdigest()  # the hashing thread ends too
        Path(name).unlink(missing_ok=True)
        if isinstance(exc, GlueError):
            raise
        raise GlueError(f"workdir: cannot read {exc.filename}: {exc.strerror}") from exc

"""The workdir as one deterministic tar: sorted paths, times 0, owner 0, modes 0644/0755. The same
tree gives the same bytes, so the tar's sha256 is the code's content address."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from glue.errors import GlueError
from glue.workdir.select import Selection

MIB = 1 << 20
LARGEST_SHOWN = 3


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


class _Hashing:
    """A write-only file that hashes and counts what passes through."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.h, self.n = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.n


def _info(name: str, st: os.stat_result, link: str | None = None) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
    if link is not None:
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, link, 0o777
    else:
        ti.size, ti.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
    return ti


def check_size(sel: Selection, cap_mb: int) -> int:
    """The files' total size; over the cap is refused naming the largest files."""
    sizes = [(rel, (sel.root / rel).stat().st_size) for rel in sel.files]
    total = sum(s for _, s in sizes)
    if total > cap_mb * MIB:
        largest = ", ".join(f"{r} ({s / MIB:.1f} MiB)" for r, s in sorted(sizes, key=lambda x: -x[1])[:LARGEST_SHOWN])
        raise GlueError(f"workdir {sel.root} holds {total / MIB:.1f} MiB, over the {cap_mb} MiB cap "
                        f"(workdir.max_size_mb); largest: {largest}. Ignore data and outputs in .gpukitignore "
                        "(data belongs in the bucket), or raise workdir.max_size_mb")
    return total


def pack(sel: Selection, cap_mb: int) -> Package:
    """Tar the selected files (refusing secret-looking ones and an oversized tree first)."""
    if sel.refused:
        more = f" (and {len(sel.refused) - 1} more: {', '.join(sel.refused[1:4])})" if sel.refused[1:] else ""
        raise GlueError(f"workdir: {sel.refused[0]} looks like a secret{more}"
                        + "; ignore it in .gpukitignore, or list it under workdir.secret_files to ship it on purpose")
    check_size(sel, cap_mb)
    fd, name = tempfile.mkstemp(prefix="gpukit-workdir-", suffix=".tar")
    listed: list[tuple[str, int]] = []
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _Hashing(raw)
            with tarfile.open(fileobj=sink, mode="w:", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
                for rel in sorted([*sel.files, *sel.links]):
                    path = sel.root / rel
                    st = path.lstat()
                    if rel in sel.links:
                        tar.addfile(_info(rel, st, os.readlink(path)))
                        listed.append((rel, 0))
                        continue
                    with open(path, "rb") as fh:
                        tar.addfile(_info(rel, st), fh)
                    listed.append((rel, st.st_size))
        return Package(Path(name), sink.h.hexdigest(), sink.n, listed)
    except OSError as exc:
        Path(name).unlink(missing_ok=True)
        raise GlueError(f"workdir: cannot read {exc.filename}: {exc.strerror}") from exc

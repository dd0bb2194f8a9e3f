"""The in-memory object bodies: hashed while written (in any part order), read without copies."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import pytest
import torch

from glue.train.storage.buffers import BlobReader, HashingSink, HashingWriter
from glue.train.storage.folder import FileStorage

PART, CHUNK = 1000, 64  # a part is written as chunks, like s3transfer's io_chunksize


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _writes(size: int, order: list[int] | None = None) -> list[tuple[int, bytes]]:
    """(offset, data) writes of a ranged download: parts in `order`, chunks of a part in order."""
    data = os.urandom(size)
    parts = list(range(0, size, PART)) or [0]
    if order is not None:
        parts = [parts[i] for i in order]
    out = []
    for start in parts:
        end = min(size, start + PART)
        for off in range(start, end, CHUNK):
            out.append((off, data[off : min(end, off + CHUNK)]))
    return out


def _download(writes: list[tuple[int, bytes]], hint: int | None, whole: bool = True) -> tuple[bytes, str]:
    sink = HashingSink(hint)
    assert sink.seekable()
    for off, chunk in writes:
        sink.seek(off)
        assert sink.write(chunk) == len(chunk)
    if whole:  # hashed as the bytes arrived: nothing is left for a second pass
        assert sink.hashed_bytes == max((off + len(chunk) for off, chunk in writes), default=0)
    buf, sha = sink.result()
    return bytes(buf), sha


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, PART, PART + 1, 3 * PART - 17, 7 * PART])
@pytest.mark.parametrize("hint", ["exact", "none", "short", "long"])
def test_sink_hashes_parts_in_any_order(size: int, hint: str) -> None:
    size_hint = {"exact": size, "none": None, "short": size // 2, "long": size + 5 * PART}[hint]
    nparts = max(1, -(-size // PART))
    shuffled = random.Random(size).sample(range(nparts), nparts)
    for order in [list(range(nparts)), list(reversed(range(nparts))), shuffled]:
        writes = _writes(size, order)
        data = b"".join(chunk for _, chunk in sorted(writes))
        got, sha = _download(writes, size_hint)
        assert got == data, f"order {order}"
        assert sha == _sha(data), f"order {order}"


def test_sink_survives_a_part_written_again() -> None:
    # s3transfer retries a part from its start; the same bytes land again, over hashed ones too.
    writes = _writes(4 * PART, [1, 0, 2, 3])
    again = [w for w in writes if PART <= w[0] < 2 * PART][:5]
    writes[3:3] = again  # part 1 restarts while still arriving
    writes += [w for w in writes if w[0] < PART][:3]  # part 0 again, after everything was hashed
    data = b"".join(chunk for _, chunk in sorted(set(writes)))
    assert _download(writes, 4 * PART) == (data, _sha(data))


def test_sink_with_a_missing_part_never_matches() -> None:
    writes = _writes(3 * PART)
    data = b"".join(chunk for _, chunk in writes)
    hole = [w for w in writes if not PART <= w[0] < 2 * PART]
    got, sha = _download(hole, 3 * PART, whole=False)
    assert len(got) == len(data) and sha != _sha(data)
    assert sha == _sha(got)  # the zeros in the hole were hashed, not skipped


def test_sink_detects_one_corrupted_byte() -> None:
    writes = _writes(5 * PART, [4, 2, 0, 3, 1])
    data = b"".join(chunk for _, chunk in sorted(writes))
    i = next(n for n, (off, _) in enumerate(writes) if off == 3 * PART + 2 * CHUNK)
    off, chunk = writes[i]
    writes[i] = (off, bytes([chunk[0] ^ 1]) + chunk[1:])
    got, sha = _download(writes, 5 * PART)
    assert sha != _sha(data) and sha == _sha(got)


def test_writer_is_a_torch_save_target() -> None:
    state = {"w": torch.randn(300, 7), "step": 3}
    ref = io.BytesIO()
    torch.save(state, ref)
    writer = HashingWriter()
    torch.save(state, writer)  # type: ignore[arg-type]
    blob, sha = writer.result()
    assert bytes(blob) == ref.getvalue() and sha == _sha(ref.getvalue())
    back = torch.load(BlobReader(blob), weights_only=True)  # type: ignore[arg-type]
    assert torch.equal(back["w"], state["w"]) and back["step"] == 3


def test_empty_writer() -> None:
    assert HashingWriter().result() == (bytearray(), _sha(b""))


def test_blob_reader_reads_seeks_and_shares_memory() -> None:
    data = bytearray(os.urandom(1000))
    r = BlobReader(data)
    assert r.read(10) == bytes(data[:10]) and r.tell() == 10
    assert r.seek(-5, io.SEEK_END) == 995 and r.read() == bytes(data[995:]) and r.read(3) == b""
    r.seek(100)
    out = bytearray(50)
    assert r.readinto(out) == 50 and out == data[100:150]
    data[100] ^= 1  # no copy was taken
    r.seek(100)
    assert r.read(1) == bytes(data[100:101])


@pytest.mark.parametrize("size", [0, 1, 4 * 1024 * 1024, 4 * 1024 * 1024 + 1, 9 * 1024 * 1024 - 3])
def test_file_storage_reads_and_hashes_in_chunks(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    st = FileStorage(tmp_path)
    st.put("a/b.pt", data)
    got, sha = st.get("a/b.pt")
    assert bytes(got) == data and sha == _sha(data)
    flipped = bytearray(data or b"\0")
    flipped[len(flipped) // 2] ^= 0x80
    (tmp_path / "a" / "b.pt").write_bytes(flipped)
    assert st.get("a/b.pt")[1] != _sha(data)

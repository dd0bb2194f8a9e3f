"""A dependency set's virtualenv as one tar, and back: what the set installed (site-packages, its scripts),
never this VM's own part (pyvenv.cfg, the python links, the image's .pth: venv.skeleton writes those on
the VM that unpacks it). Uncompressed: for the Hugging Face example's set gzip made the pack 3.1x smaller
but its unpacking 1.9-3.6x slower, plus ~3 s to compress, while the bucket is read in parallel parts at
270-460 MiB/s (bench/env_prepare.py; docs/benchmarks.md, "The run's environment").

The venv lives at the same path on every VM (WorkPaths.env_dir), so nothing in it is relocated.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.venv import BASE_PTH, MARKER

# This VM's own files: written by venv.skeleton / venv.mark where the pack is unpacked, never packed.
OWN_NAMES = ("pyvenv.cfg", BASE_PTH, MARKER)


def _members(env: Path) -> list[Path]:
    """Every folder and plain file under `env` but the VM's own (links are the skeleton's: bin/python…)."""
    out: list[Path] = []
    for top, dirs, files in os.walk(env):
        dirs.sort()
        base = Path(top)
        for name in dirs:
            if not (base / name).is_symlink():
                out.append(base / name)
        out.extend(base / name for name in sorted(files)
                   if name not in OWN_NAMES and not (base / name).is_symlink())
    return out


def pack(env: Path) -> tuple[bytes, dict[str, int]]:
    """The tar's bytes, and {files, unpacked_bytes} (what unpacking it writes)."""
    buf = io.BytesIO()
    files = size = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _members(env):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(env).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                files, size = files + 1, size + info.size
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue(), {"files": files, "unpacked_bytes": size}


def check_member(member: tarfile.TarInfo) -> None:
    """Only what pack() writes: plain files and folders inside the venv, none of the VM's own files."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise WorkspaceError(f"the packed environment holds {member.name!r}, outside its folder; not unpacking it")
    if not (member.isfile() or member.isdir()):
        raise WorkspaceError(f"the packed environment holds {member.name!r}, which is not a file or folder; "
                             "not unpacking it")
    if path.name in OWN_NAMES:
        raise WorkspaceError(f"the packed environment holds {member.name!r}, which each VM writes itself; "
                             "not unpacking it")
    if member.mode & 0o7000:
        raise WorkspaceError(f"the packed environment's {member.name!r} has a set-id or sticky bit; not unpacking it")


def unpack(data: bytes | bytearray, env: Path) -> int:
    """Every member checked first, then the same bytes unpacked into `env` (which venv.skeleton made): by GNU
    tar where there is one (2-3x faster than tarfile for the thousands of files of a set, measured), owned by
    whoever unpacks, the umask applied. Returns the number of files."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for m in members:
            check_member(m)
        gnu_tar = shutil.which("tar")
        if gnu_tar is None:
            for m in members:
                m.mode &= 0o755  # as the umask would: no group/other write
            extra = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(env, members=members, **extra)  # type: ignore[arg-type]
    if gnu_tar is not None:
        res = subprocess.run([gnu_tar, "-x", "-f", "-", "-C", str(env), "--no-same-owner", "--no-same-permissions"],
                             input=data, capture_output=True, timeout=600, check=False)
        if res.returncode != 0:
            why = res.stderr.decode(errors="replace").strip().splitlines()
            raise WorkspaceError(f"unpacking the packed environment failed: {why[-1] if why else res.returncode}")
    return sum(m.isfile() for m in members)

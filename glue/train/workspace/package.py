"""Fetch the run's code package from the bucket, check its sha256, unpack it for one attempt."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from glue.train.errors import ObjectMissingError, StorageError
from glue.train.layout import code_key
from glue.train.storage.target import Storage
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import WorkPaths


def fetch(storage: Storage, sha256: str, size: int | None = None) -> bytes:
    """The package's bytes, refused unless they hash to the manifest's sha256."""
    key = code_key(sha256)
    try:
        data, got = storage.get(key, size_hint=size)
    except ObjectMissingError:
        raise WorkspaceError(f"the run's code package {key} is not in the bucket; it was uploaded by "
                             "`glue deploy`: deploy a new run") from None
    except StorageError as exc:
        raise WorkspaceError(f"could not fetch the code package {key} from the bucket: {exc}") from None
    if got != sha256:
        raise WorkspaceError(f"the code package {key} has sha256 {got}, not the manifest's {sha256}: "
                             "the object was changed in the bucket; not running it")
    return bytes(data)


def _check_member(member: tarfile.TarInfo) -> None:
    """Only plain files, folders and links that stay inside the tree (what `glue deploy` packs)."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        raise WorkspaceError(f"the code package holds {member.name!r}, outside its folder; not unpacking it")
    if member.issym():
        if PurePosixPath(member.linkname).is_absolute() or _escapes(path.parent / member.linkname):
            raise WorkspaceError(f"the code package's link {member.name} points outside its folder")
    elif not (member.isfile() or member.isdir()):
        raise WorkspaceError(f"the code package holds {member.name!r}, which is not a file or folder")


def _escapes(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def unpack(data: bytes, dest: Path) -> int:
    """Unpack into `dest` (made anew). Returns the number of files."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    files = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        links = {PurePosixPath(m.name) for m in members if m.issym()}
        for m in members:
            _check_member(m)
            # Nothing under a link: a chain of links (`d -> ..`, then `d/e -> ..`) would walk out of the tree.
            if any(parent in links for parent in PurePosixPath(m.name).parents):
                raise WorkspaceError(f"the code package holds {m.name!r} below a link; not unpacking it")
            files += m.isfile()
        tar.extractall(dest, members=members)  # every member checked above
    return files


def prepare(storage: Storage, paths: WorkPaths, package: dict[str, Any]) -> dict[str, Any]:
    """The package fetched, checked and unpacked into the attempt's code folder; its record written."""
    sha = str(package["sha256"])
    data = fetch(storage, sha, package.get("size"))
    files = unpack(data, paths.code_dir)
    record = {"sha256": sha, "size": len(data), "files": files, "code_dir": str(paths.code_dir)}
    paths.package_record.write_text(json.dumps(record))
    return record

"""A dependency set's packed virtualenv in the bucket (envs/<set>/: glue.train.layout): the pack, named by its
own sha256, then its index, which says which pack to use, its sha256 and where it unpacks. Written by the
first VM that built the set from the wheelhouse; read by every later one."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from glue.train.errors import ObjectMissingError, StorageError
from glue.train.layout import env_pack_index_key, env_pack_key
from glue.train.storage.target import Storage
from glue.train.workspace.errors import WorkspaceError

FIELDS = ("set_sha256", "sha256", "size", "prefix", "files", "unpacked_bytes")


def _refuse(set_sha256: str, what: str) -> WorkspaceError:
    return WorkspaceError(f"{what}; not using it (delete {env_pack_index_key(set_sha256).rsplit('/', 1)[0]}/ "
                          "from the bucket to have the next VM pack the set again from the wheelhouse)")


def find(storage: Storage, set_sha256: str) -> dict[str, Any] | None:
    """The set's pack index, or None when no VM has packed the set yet. A broken index is refused."""
    key = env_pack_index_key(set_sha256)
    try:
        data, _ = storage.get(key)
    except ObjectMissingError:
        return None
    except StorageError as exc:
        raise WorkspaceError(f"could not read {key} from the bucket: {exc}") from None
    try:
        index = json.loads(bytes(data))
        missing = [f for f in FIELDS if f not in index]
    except (ValueError, TypeError):
        raise _refuse(set_sha256, f"the packed environment's index {key} is not JSON") from None
    if missing or index["set_sha256"] != set_sha256:
        raise _refuse(set_sha256, f"the packed environment's index {key} is not one gpukit wrote "
                                  f"({'no ' + ', '.join(missing) if missing else 'another set'})")
    return dict(index)


def fetch(storage: Storage, index: dict[str, Any]) -> bytearray | None:
    """The pack's bytes, refused unless they hash to the sha256 its index records; None if it is gone."""
    digest, want = str(index["set_sha256"]), str(index["sha256"])
    key = env_pack_key(digest, want)
    try:
        data, got = storage.get(key, size_hint=int(index["size"]))
    except ObjectMissingError:
        return None
    except StorageError as exc:
        raise WorkspaceError(f"could not fetch the packed environment {key} from the bucket: {exc}") from None
    if got != want:
        raise _refuse(digest, f"the packed environment {key} has sha256 {got}, not the {want} its index records: "
                              "it was changed in the bucket")
    return data


def store(storage: Storage, set_sha256: str, data: bytes, meta: dict[str, Any]) -> dict[str, Any]:
    """The pack, then its index (a set whose index is in the bucket has its pack there). Returns the index."""
    sha = hashlib.sha256(data).hexdigest()
    index = {**meta, "set_sha256": set_sha256, "sha256": sha, "size": len(data),
             "key": env_pack_key(set_sha256, sha)}
    try:
        storage.put(index["key"], data)
        storage.put(env_pack_index_key(set_sha256), json.dumps(index, indent=1).encode())
    except StorageError as exc:
        raise WorkspaceError(f"could not store the packed environment in the bucket: {exc}") from None
    return index

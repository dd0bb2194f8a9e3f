"""A resolved set's wheels fetched from the bucket (wheels/<set>/, uploaded once by the first deploy:
glue.workdir.wheelhouse), each checked against the sha256 the manifest pins."""

from __future__ import annotations

import shutil
from pathlib import Path

from glue.train.errors import ObjectMissingError, StorageError
from glue.train.layout import wheel_key, wheelhouse_prefix
from glue.train.storage.target import Storage
from glue.train.workspace.errors import WorkspaceError


def fetch(storage: Storage, set_sha256: str, wheels: dict[str, str], folder: Path) -> None:
    """The set's wheels into `folder`, each checked against the sha256 the manifest pins."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    prefix = wheelhouse_prefix(set_sha256)
    for name, want in sorted(wheels.items()):
        try:
            data, got = storage.get(wheel_key(set_sha256, name))
        except ObjectMissingError:
            raise WorkspaceError(f"wheel {name} of the run's dependency set is not in the bucket "
                                 f"({prefix}); deploy a new run to resolve the requirements again") from None
        except StorageError as exc:
            raise WorkspaceError(f"could not fetch wheel {name} from the bucket: {exc}") from None
        if got != want:
            raise WorkspaceError(f"wheel {name} in the bucket has sha256 {got}, not the manifest's {want}; "
                                 "not installing it")
        (folder / name).write_bytes(bytes(data))

from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.infra import preflight


def test_missing_sshd_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "SSHD", Path("/nonexistent/sshd"))
    with pytest.raises(GlueError, match="openssh-server"):
        preflight.check_local_backend()


def test_missing_fuse_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = preflight.shutil.which
    monkeypatch.setattr(preflight.shutil, "which", lambda n: None if n == "fusermount3" else real_which(n))
    with pytest.raises(GlueError, match="fuse3"):
        preflight.check_local_backend()

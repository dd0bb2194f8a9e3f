"""The kit home: a GPUKIT_HOME that cannot be a directory is one clear line naming it, for every
command, and nothing that is there is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.paths import home


def test_home_is_created_on_demand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_HOME", str(tmp_path / "a" / "home"))
    assert home() == tmp_path / "a" / "home" and home().is_dir()


@pytest.mark.parametrize("where", ["file", "below a file", "cannot exist"])
def test_a_home_that_cannot_be_a_directory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       where: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    path = {"file": afile, "below a file": afile / "sub", "cannot exist": Path("/proc/gpukit-nope")}[where]
    monkeypatch.setenv("GPUKIT_HOME", str(path))
    with pytest.raises(GlueError) as info:
        home()
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"GPUKIT_HOME={str(path)!r}: cannot use {path} as a directory")
    assert "point GPUKIT_HOME at a directory you can write" in line
    assert afile.read_text() == "keep me\n"  # nothing lost


@pytest.mark.parametrize("args", [["status"], ["doctor"], ["image", "list"]])
def test_every_command_reports_a_bad_home_in_one_line(tmp_path: Path, args: list[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    env = {**os.environ, "GPUKIT_HOME": str(afile)}
    env.pop("GPUKIT_IMAGES", None)
    out = subprocess.run([sys.executable, "-m", "glue.cli", *args], env=env, capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"Error: GPUKIT_HOME={str(afile)!r}: cannot use {afile} as a directory (a file is in the way); point "
        "GPUKIT_HOME at a directory you can write, or unset it (the kit's state is then in .gpukit/ of the project)"]

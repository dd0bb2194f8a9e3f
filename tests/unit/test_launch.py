"""The `glue` console script (glue.launch): on a Python the controller does not run on, or without the
[controller] extra, one line saying what is missing and how to get it; never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from glue import launch


def test_an_old_python_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "version_info", (3, 10, 12, "final", 0))
    with pytest.raises(SystemExit) as exc:
        launch.main()
    line = str(exc.value.code)
    assert "\n" not in line and line.startswith("glue: the controller needs Python >= 3.11 (this is 3.10.12")
    assert "pipx install --python python3.11 'gpukit[controller]'" in line


def test_a_missing_controller_module_is_one_line_with_the_fix() -> None:
    # click made unimportable, as in a venv that has the wheel without its [controller] extra
    code = ("import sys; sys.modules['click'] = None; sys.argv = ['glue', '--help']; "
            "from glue import launch; launch.main()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip()  # click itself is installed here: glue cannot tell which extra, so it names the module
    assert "\n" not in line and line.startswith("glue: this command needs the module 'click', which is not installed")


def test_the_controller_extra_is_installed_here() -> None:
    assert launch.missing_controller_packages() == []


def test_without_the_controller_extra_the_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = launch.metadata.distribution

    def distribution(name: str) -> object:
        if name in ("click", "rich"):
            raise launch.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(launch.metadata, "distribution", distribution)
    assert launch.missing_controller_packages() == ["click", "rich"]
    monkeypatch.setitem(sys.modules, "click", None)
    monkeypatch.delitem(sys.modules, "glue.cli", raising=False)
    monkeypatch.setattr(sys, "argv", ["glue", "--help"])
    with pytest.raises(SystemExit) as exc:
        launch.main()
    assert exc.value.code == ("glue: the controller's packages click, rich are not installed (no module named "
                              "'click'); install them: pip install 'gpukit[controller]' (or: pipx install "
                              "'gpukit[controller]')")

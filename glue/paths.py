"""Where kit state lives: `.gpukit/` in the project root (~/.gpukit for a pip-installed glue), or $GPUKIT_HOME;
where the kit's own files are (the checkout, or what the wheel installed)."""

from __future__ import annotations

import os
import shutil
import site
import sys
from pathlib import Path

from glue.errors import GlueError

SOURCE_ROOT = Path(__file__).resolve().parent.parent


def _kit_root() -> Path:
    """The checkout glue runs from; a pip-installed glue: where the wheel put the kit's ansible/, terraform/
    and images/ (<prefix>/share/gpukit, setup.py), beside the venv's or the user's site-packages."""
    if (SOURCE_ROOT / "terraform").is_dir():
        return SOURCE_ROOT
    for prefix in (sys.prefix, site.getuserbase()):
        if (Path(prefix) / "share" / "gpukit" / "terraform").is_dir():
            return Path(prefix) / "share" / "gpukit"
    return SOURCE_ROOT


PROJECT_ROOT = _kit_root()
INSTALLED = PROJECT_ROOT != SOURCE_ROOT


def home() -> Path:
    """Kit state directory (VM disks, bucket data, terraform working copy, keys): $GPUKIT_HOME, else .gpukit/
    in the project, or ~/.gpukit for a pip-installed glue (a reinstall must not take the state with it).
    Created on demand; one that cannot be (a file there, a path that cannot exist, no permission) is one
    GlueError line."""
    base = os.environ.get("GPUKIT_HOME")
    path = Path(base).resolve() if base else (Path.home() if INSTALLED else PROJECT_ROOT) / ".gpukit"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise GlueError(state_dir_error(path, exc, "GPUKIT_HOME", base, "the kit's state is then in .gpukit/ "
                                        "of the project")) from None
    return path


def glue_command() -> str:
    """glue as typed in another shell here: `glue` when that is this one on PATH, else this venv's glue
    (relative to the working directory when under it: `.venv/bin/glue` in the project)."""
    mine = Path(sys.prefix) / "bin" / "glue"
    on_path = shutil.which("glue")
    if on_path and Path(on_path).resolve() == mine.resolve():
        return "glue"
    try:
        rel = str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)
    return rel if "/" in rel else f"./{rel}"  # a bare name would be looked up on PATH


def state_dir_error(path: Path, exc: OSError, env: str, base: str | None, unset: str) -> str:
    """One line for a state directory that cannot be used: the path, why, and how to fix it."""
    why = "a file is in the way" if isinstance(exc, FileExistsError | NotADirectoryError) else \
        (exc.strerror or str(exc)).lower()
    if base:
        return (f"{env}={base!r}: cannot use {path} as a directory ({why}); point {env} at a directory you "
                f"can write, or unset it ({unset})")
    return (f"cannot use {path} as a directory ({why}): move what is there away, or set {env} to a directory "
            "you can write")


def ssh_client_key_path(home: Path) -> Path:
    """The kit's SSH private key (glue.infra.ssh_keys creates it; backends log in with it)."""
    return home / "ssh" / "id_ed25519"


def venv_bin() -> Path:
    """The bin/ directory of the interpreter running glue (the project venv)."""
    return Path(sys.executable).parent


def tool(name: str) -> str:
    """A console script installed into our venv (rclone, ansible-playbook), else the bare name."""
    candidate = venv_bin() / name
    return str(candidate) if candidate.exists() else name


def write_secret(path: Path, text: str) -> None:
    """Write a file that holds a secret: created 0600 before any byte lands in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


# What a server or VM the kit starts may inherit from the controller: nothing that could hold a secret
# (a user's LYCEUM_API_KEY, AWS_*, tokens) or point at the kit's files.
_ALLOWED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


def minimal_env(**extra: str) -> dict[str, str]:
    """An allow-listed environment for a child process, plus `extra`."""
    env = {k: os.environ[k] for k in _ALLOWED_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["HOME"] = "/nonexistent"
    env.update(extra)
    return env

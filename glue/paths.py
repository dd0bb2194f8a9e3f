"""Where kit state lives: `.gpukit/` in the project root, or $GPUKIT_HOME."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from glue.errors import GlueError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    """Kit state directory (VM disks, bucket data, terraform working copy, keys). Created on demand;
    one that cannot be (a file there, a path that cannot exist, no permission) is one GlueError line."""
    base = os.environ.get("GPUKIT_HOME")
    path = Path(base).resolve() if base else PROJECT_ROOT / ".gpukit"
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

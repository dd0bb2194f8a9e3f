"""The run's command against its workdir, before any VM work: a relative file it names must ship."""

from __future__ import annotations

from pathlib import PurePosixPath

from glue.errors import GlueError

PYTHONS = ("python", "python3")


def _module_files(module: str) -> tuple[str, ...]:
    base = module.replace(".", "/")
    return (f"{base}.py", f"{base}/__main__.py", f"{base}/__init__.py")


def _norm(path: str) -> str:
    return PurePosixPath(path).as_posix().removeprefix("./")


def in_package(argv: list[str], files: set[str], where: str) -> bool:
    """True when the program the command runs is a file of the package (nothing to probe on the VM);
    False when it is not about the package (a module or program of the image: the VM is asked).
    A relative script path that is not in the package is refused in one line."""
    if not argv:
        return False
    prog = argv[0]
    if prog in PYTHONS or PurePosixPath(prog).name in PYTHONS:
        rest = argv[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return any(f in files for f in _module_files(rest[1]))
        script = next((a for a in rest if not a.startswith("-")), None)
        if script is None or PurePosixPath(script).is_absolute():
            return False
        if _norm(script) not in files:
            raise GlueError(f"command runs {script}, which is not in the workdir {where} (ignored, or a typo?); "
                            "commands run in the unpacked workdir, so paths are relative to it")
        return True
    if "/" in prog and not PurePosixPath(prog).is_absolute():
        if _norm(prog) not in files:
            raise GlueError(f"command {prog} is not in the workdir {where}; commands run in the unpacked workdir")
        return True
    return False

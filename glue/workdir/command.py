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


def _script(args: list[str]) -> str | None:
    """What python runs: "-m MODULE", a script path, or None (`-c CODE`, nothing)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return f"-m {args[i + 1]}"
        if a == "-c":
            return None
        if a in ("-W", "-X"):  # options that take a value
            i += 2
            continue
        if not a.startswith("-"):
            return a
        i += 1
    return None


def in_package(argv: list[str], files: set[str], where: str) -> bool:
    """True when the program the command runs is a file of the package (nothing to probe on the VM);
    False when it is not about the package (a module or program of the image: the VM is asked).
    A relative script path that is not in the package is refused in one line."""
    if not argv:
        return False
    prog = argv[0]
    if prog in PYTHONS or PurePosixPath(prog).name in PYTHONS:
        script = _script(argv[1:])
        if script is None:
            return False
        if script.startswith("-m "):
            return any(f in files for f in _module_files(script[3:]))
        if PurePosixPath(script).is_absolute():
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

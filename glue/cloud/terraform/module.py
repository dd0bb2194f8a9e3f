"""The user's root module (`glue up --backend terraform --module DIR`): checked before terraform runs and
recorded in <home>/user-module/module.json, where the backend and the kit's terraform run read it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from glue.errors import GlueError

# What gpukit passes to the module (terraform/envs/terraform/main.tf): each must be declared there.
INPUTS = ("vm_count", "name_prefix", "ssh_public_key")
GUIDE = "docs/guides/own-terraform.md"
_VARIABLE = re.compile(r'^\s*variable\s+"([A-Za-z0-9_-]+)"', re.MULTILINE)


def _record(home: Path) -> Path:
    return home / "user-module" / "module.json"


def check(path: Path) -> Path:
    """The module's absolute path, or one GlueError line saying what is wrong with it and how to fix it."""
    where = path.expanduser().resolve()
    if not where.is_dir():
        raise GlueError(f"--module {path}: no such directory; give the folder of your root module ({GUIDE})")
    files = sorted(where.glob("*.tf"))
    if not files and not any(where.glob("*.tf.json")):
        raise GlueError(f"--module {path}: no .tf files in {where}; give the folder of your root module ({GUIDE})")
    if files and not any(where.glob("*.tf.json")):
        declared = {m.group(1) for f in files for m in _VARIABLE.finditer(f.read_text(errors="replace"))}
        missing = [v for v in INPUTS if v not in declared]
        if missing:
            raise GlueError(f"--module {path}: declares no variable {', '.join(missing)}; gpukit passes "
                            f"{', '.join(INPUTS)}: add `variable \"{missing[0]}\" {{}}` and use it ({GUIDE})")
    return where


def record(home: Path, path: Path) -> Path:
    """Check the module and remember it for every later terraform run of this kit home."""
    where = check(path)
    rec = _record(home)
    rec.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"module": str(where)})
    if not rec.exists() or rec.read_text() != text:
        rec.write_text(text)
    return where


def recorded(home: Path) -> Path:
    """The module recorded by `glue up --module`; one GlueError line when there is none."""
    try:
        return Path(json.loads(_record(home).read_text())["module"])
    except FileNotFoundError:
        raise GlueError("the terraform backend has no module yet: run `glue up --backend terraform --module DIR` "
                        f"({GUIDE})") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GlueError(f"{_record(home)} cannot be read ({exc}); run `glue up --backend terraform --module DIR` "
                        "again") from None


_SKIPPED = (".terraform", ".git")


def digest(path: Path) -> str:
    """The module's files as one hash (its .terraform/, .git/ and any state left out): a change to them makes
    the next `glue up` apply, though its variables did not change."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path)
        if rel.parts[0] in _SKIPPED or ".tfstate" in f.name:
            continue
        h.update(f"{rel.as_posix()}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()

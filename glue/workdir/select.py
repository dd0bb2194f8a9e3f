"""Which files of a workdir ship: every file not ignored by a `.gitignore` (at any level of the workdir,
and above it up to its git repository's top, as git reads them) or the root's `.gpukitignore`; `.git/`
and `__pycache__/` never. Files that look like secrets are refused by name unless the run config lists
them in `workdir.secret_files`."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from glue.errors import GlueError

IGNORE_FILES = (".gitignore", ".gpukitignore")
NEVER = (".git", "__pycache__")
# Basenames (or paths ending so) that usually hold credentials. docs/guides/own-job.md lists them.
SECRET_PATTERNS = (".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*",
                   "id_ed25519*", ".netrc", "_netrc", ".pypirc", ".git-credentials", ".s3cfg", ".boto",
                   "credentials.json", "application_default_credentials.json", ".aws/credentials",
                   ".aws/config", ".docker/config.json", ".kube/config")
NOT_SECRET_SUFFIXES = (".example", ".sample", ".template", ".dist")


@dataclass
class Selection:
    root: Path
    files: list[str] = field(default_factory=list)      # posix paths relative to root, sorted
    links: list[str] = field(default_factory=list)      # in-tree symlinks (kept as links)
    ignored: list[str] = field(default_factory=list)    # by an ignore file (folders end in '/')
    secrets: list[str] = field(default_factory=list)    # secret-looking, shipped because listed
    refused: list[str] = field(default_factory=list)    # secret-looking, not listed


# One regex for the basename patterns (a thousand files, twenty patterns: fnmatch one by one was most of
# the selection's time), and the path ones matched as path endings.
_SECRET_NAME = re.compile("|".join(fnmatch.translate(p) for p in SECRET_PATTERNS if "/" not in p))
_SECRET_PATHS = tuple(p for p in SECRET_PATTERNS if "/" in p)


def looks_secret(rel: str) -> bool:
    name = rel.rpartition("/")[2]
    if name.endswith(NOT_SECRET_SUFFIXES):
        return False
    return bool(_SECRET_NAME.match(name)) or any(rel == p or rel.endswith("/" + p) for p in _SECRET_PATHS)


def _spec(folder: Path, name: str) -> pathspec.PathSpec | None:
    f = folder / name
    if not f.is_file():
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(f.read_text().splitlines())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GlueError(f"cannot read {f}: {exc}; fix or remove it") from exc


# (base, prefix, spec): the spec's folder is `base` below the workdir (""), or the workdir is `prefix`
# below the spec's folder (a .gitignore of the repository above the workdir).
Spec = tuple[str, str, pathspec.PathSpec]


def _ignored(specs: list[Spec], rel: str, is_dir: bool) -> bool:
    """Each spec applies to paths below its folder; as in git, a later (deeper) file's verdict wins."""
    verdict = False
    for base, prefix, spec in specs:
        if base and not rel.startswith(base + "/"):
            continue
        sub = prefix + (rel[len(base) + 1:] if base else rel)
        res = spec.check_file(sub + ("/" if is_dir else ""))
        if res.include is not None:
            verdict = bool(res.include)
    return verdict


def _repository_specs(root: Path) -> list[Spec]:
    """The .gitignore files of the folders above the workdir, up to its git repository's top (outermost
    first), as git applies them; none outside a repository."""
    root = root.resolve()
    ancestors = []
    for folder in root.parents:
        ancestors.append(folder)
        if (folder / ".git").exists():
            break
    else:
        return []
    if (root / ".git").exists():
        return []
    specs: list[Spec] = []
    for folder in reversed(ancestors):
        spec = _spec(folder, ".gitignore")
        if spec is not None:
            specs.append(("", root.relative_to(folder).as_posix() + "/", spec))
    return specs


def select(root: Path, secret_files: tuple[str, ...] = ()) -> Selection:
    """Walk `root` in sorted order and sort every path into files, ignored, secret and refused."""
    sel = Selection(root=root)
    allowed = {s.removeprefix("./") for s in secret_files}
    root_specs: list[Spec] = [*_repository_specs(root), *(
        ("", "", s) for s in (_spec(root, ".gitignore"), _spec(root, ".gpukitignore")) if s is not None)]

    def walk(folder: Path, rel_dir: str, specs: list[Spec]) -> None:
        if rel_dir:
            nested = _spec(folder, ".gitignore")
            specs = [*specs, (rel_dir, "", nested)] if nested else specs
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            is_dir = e.is_dir(follow_symlinks=False)
            if e.name in NEVER and is_dir:
                continue
            if _ignored(specs, rel, is_dir):
                sel.ignored.append(rel + ("/" if is_dir else ""))
                continue
            if is_dir:
                walk(Path(e.path), rel, specs)
                continue
            secret = looks_secret(rel)
            if secret and rel not in allowed:
                sel.refused.append(rel)
                continue
            if secret:
                sel.secrets.append(rel)
            if e.is_symlink():
                _check_link(root, Path(e.path), rel)
                sel.links.append(rel)
            elif e.is_file(follow_symlinks=False):
                sel.files.append(rel)
            # sockets, fifos, devices: nothing to ship

    walk(root, "", root_specs)
    return sel


def _check_link(root: Path, path: Path, rel: str) -> None:
    target = os.readlink(path)
    resolved = (path.parent / target).resolve()
    if os.path.isabs(target) or not resolved.is_relative_to(root.resolve()):
        raise GlueError(f"workdir: {rel} is a link to {target}, outside the workdir; copy the file in, or "
                        "ignore the link in .gpukitignore")

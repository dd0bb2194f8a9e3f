"""Everything `glue deploy` checks about the user's job before any VM or bucket work: the workdir
found, selected and packed, the command found in it, the requirements read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glue.errors import GlueError
from glue.workdir import command, gitinfo, requirements
from glue.workdir.pack import Package, pack
from glue.workdir.select import Selection, select


@dataclass
class Plan:
    root: Path | None = None
    selection: Selection | None = None
    package: Package | None = None
    requirements: list[str] = field(default_factory=list)
    command_in_package: bool = False
    git: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.package is None and not self.requirements

    def close(self) -> None:
        if self.package is not None:
            self.package.close()

    def manifest_workdir(self, uploaded: bool) -> dict[str, Any] | None:
        """The manifest's `workdir` record (the files' list stays in the bucket's package index)."""
        if self.package is None:
            return None
        from glue.train.layout import code_key

        return {"sha256": self.package.sha256, "size": self.package.size, "files": len(self.package.files),
                "key": code_key(self.package.sha256), "path": str(self.root), "uploaded": uploaded,
                "command_in_package": self.command_in_package, "git": self.git}

    def describe(self) -> dict[str, Any]:
        """What would ship (`glue deploy --dry-run`)."""
        sel, pkg = self.selection, self.package
        return {
            "workdir": str(self.root) if self.root else None,
            "sha256": pkg.sha256 if pkg else None, "size": pkg.size if pkg else 0,
            "files": [{"path": p, "size": s} for p, s in pkg.files] if pkg else [],
            "ignored": sel.ignored if sel else [], "secret_files_shipped": sel.secrets if sel else [],
            "refused": sel.refused if sel else [], "requirements": self.requirements,
            "command_in_package": self.command_in_package, "git": self.git,
        }


def workdir_of(spec_path: str | None, config_path: Path, override: Path | None) -> Path | None:
    """--workdir, else run.yaml's `workdir.path` relative to the run config's folder; checked to be a folder."""
    if override is None and spec_path is None:
        return None
    root = override if override is not None else (config_path.resolve().parent / str(spec_path))
    root = root.expanduser().resolve()
    if not root.exists():
        raise GlueError(f"workdir {root} does not exist; fix `workdir:` in the run config (relative to its "
                        "folder) or --workdir")
    if not root.is_dir():
        raise GlueError(f"workdir {root} is not a folder; point `workdir:` (or --workdir) at your code's folder")
    return root


def make(rc: Any, config_path: Path, override: Path | None, *, refuse: bool = True) -> Plan:
    """The plan for `rc` (a RunConfig). refuse=False (dry run) lists secret-looking files instead of refusing."""
    spec = rc.workdir
    root = workdir_of(spec.path if spec else None, config_path, override)
    if root is None:
        return Plan(requirements=requirements.lines_of(rc.requirements, None, set()))
    sel = select(root, tuple(spec.secret_files) if spec else ())
    shipped = set(sel.files) | set(sel.links)
    lines = requirements.lines_of(rc.requirements, root, shipped)
    in_pkg = command.in_package(list(rc.command), shipped, str(root))
    cap = spec.max_size_mb if spec else 256
    if not refuse and sel.refused:
        held, sel.refused = sel.refused, []
        try:
            pkg = pack(sel, cap)
        finally:
            sel.refused = held
    else:
        pkg = pack(sel, cap)
    return Plan(root=root, selection=sel, package=pkg, requirements=lines, command_in_package=in_pkg,
                git=gitinfo.repo_info(root))

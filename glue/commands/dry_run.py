"""`glue deploy --dry-run`: what would ship, read from the user's folder only (no VM, no bucket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from glue.errors import GlueError
from glue.runs import config as runconfig
from glue.workdir import plan as wplan

SHOWN = 25  # files and ignored paths listed in the table (--json lists all)


def describe(run_id: str, config_path: Path, workdir: Path | None) -> dict[str, Any]:
    rc = runconfig.load(config_path, run_id, "<bucket>")
    plan = wplan.make(rc, config_path, workdir, refuse=False)
    try:
        return {"run": run_id, "command": list(rc.command), "runtime": rc.runtime, **plan.describe()}
    finally:
        plan.close()


def _listed(items: list[str]) -> str:
    more = f" … and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return escape(", ".join(items[:SHOWN]) + more) if items else "—"


def show(run_id: str, config_path: Path, workdir: Path | None, as_json: bool) -> None:
    """Print what would ship; a refused (secret-looking) file then fails the command, as deploy would."""
    d = describe(run_id, config_path, workdir)
    if as_json:
        click.echo(json.dumps(d, indent=2))
    else:
        out = Console()
        t = Table(title=f"glue deploy --dry-run: run {run_id} (nothing uploaded, nothing started)", box=None,
                  show_header=False)
        t.add_row("command", escape(" ".join(d["command"])) + ("  [green](in the workdir)[/]"
                                                               if d["command_in_package"] else ""))
        t.add_row("workdir", escape(str(d["workdir"] or "— (the command must exist on the VM)")))
        if d["workdir"]:
            t.add_row("package", f"{len(d['files'])} files, {d['size'] / 2**20:.2f} MiB, sha256 {d['sha256']}")
            t.add_row("files", _listed([f["path"] for f in d["files"]]))
            t.add_row("ignored", _listed(d["ignored"]))
            if d["secret_files_shipped"]:
                shipped = _listed(d["secret_files_shipped"])
                t.add_row("secret files", f"[yellow]{shipped}[/] (workdir.secret_files)")
            if d["refused"]:
                t.add_row("refused", "[red]" + _listed(d["refused"]) + "[/] (look like secrets)")
            git = d["git"]
            if git.get("commit"):
                t.add_row("git", f"{git['commit'][:12]}{' + uncommitted changes' if git['dirty'] else ''} "
                                 f"({escape(str(git['repository']))})")
        reqs = escape("; ".join(d["requirements"]))
        t.add_row("requirements", f"{reqs} (resolved at deploy for the VM's Python and image)" if reqs else "—")
        out.print(t)
    if d["refused"]:
        raise GlueError(f"deploy would refuse: {d['refused'][0]} looks like a secret; ignore it in .gpukitignore, or "
                        "list it under workdir.secret_files to ship it on purpose")

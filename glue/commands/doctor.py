"""glue doctor: is this machine (and, on Lyceum, the account) ready for `glue up`? Creates no VM.

Each check is one line, ✓ or ✗, with the fix. Exit status 1 when any check fails. The checks are
glue.operations.doctor's.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape

from glue.cloud import BACKENDS
from glue.cluster.current import ClusterConfig
from glue.operations.doctor import run_checks
from glue.paths import home


@click.command()
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="The backend to check (default: the cluster's, else local).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(backend: str | None, as_json: bool) -> None:
    """Check that `glue up` can work here, without creating a VM: on Lyceum the API key (one
    authenticated read), capacity, storage credentials and a probe object; everywhere the SSH key,
    terraform and the provider mirror. Exit status 1 when a check fails."""
    h = home()
    chosen = backend or ClusterConfig.load(h).backend
    checks = run_checks(h, chosen)
    ok = all(c.ok for c in checks)
    if as_json:
        click.echo(json.dumps({"backend": chosen, "ok": ok, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        out = Console(highlight=False, soft_wrap=True)
        for c in checks:
            mark = "[green]✓[/]" if c.ok else "[red]✗[/]"
            fix = f" — fix: {escape(c.fix)}" if c.fix and not c.ok else ""
            out.print(f"{mark} {escape(c.name)}: {escape(c.detail)}{fix}")
    if not ok:
        raise SystemExit(1)


COMMANDS = [doctor]

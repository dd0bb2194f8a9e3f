"""glue doctor: is this machine (and, on Lyceum, the account) ready for `glue up`? Creates no VM.

Each check is one line, ✓ or ✗, with the fix. Exit status 1 when any check fails. The checks are
glue.operations.doctor's.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape

from glue.bucket_access.own import OwnBucket
from glue.cloud import BACKENDS
from glue.cluster.current import ClusterConfig
from glue.commands.bucket_options import asked, bucket_options
from glue.operations.doctor import run_checks
from glue.paths import home


@click.command()
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="The backend to check (default: the cluster's, else local).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@bucket_options(kit_bucket=False)
def doctor(backend: str | None, as_json: bool, bucket_endpoint: str | None, bucket_name: str | None,
           bucket_region: str | None, bucket_profile: str | None) -> None:
    """Check that `glue up` can work here, without creating a VM: on Lyceum the API key (one
    authenticated read), capacity, storage credentials; the bucket where it can be probed without starting
    anything (yours: --bucket-endpoint and --bucket, else the one `glue up` configured): a write, read
    back, list, ranged GET, delete and the 404 after it, and whether it keeps versions; everywhere the SSH
    key, terraform and the provider mirror. Exit status 1 when a check fails."""
    h = home()
    chosen = backend or ClusterConfig.load(h).backend
    given = asked(bucket_endpoint, bucket_name, bucket_region, bucket_profile)
    if given.any() and (given.endpoint is None or given.name is None):
        raise click.UsageError("a bucket to check needs both --bucket-endpoint URL and --bucket NAME")
    bucket = None
    if given.any():
        bucket = OwnBucket.parse({k: v for k, v in (("endpoint", given.endpoint), ("name", given.name),
                                                    ("region", given.region), ("profile", given.profile))
                                  if v is not None}, "glue doctor")
    checks = run_checks(h, chosen, bucket)
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

"""`glue`: the gpukit command line. Commands live in glue/commands/; this wires them up."""

from __future__ import annotations

import logging
from typing import Any

import click

from glue.errors import GlueError

# paramiko's transport thread logs a broken connection with a traceback through logging's last-resort
# handler; glue reports the failure itself, in one line ("X does not answer SSH; ...").
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class UsageLine(click.ClickException):
    """A usage error as one line (click prints usage, a hint and a blank line before it): exit 2."""

    exit_code = 2


class GlueGroup(click.Group):
    """Turns GlueError into one clear line on stderr and a non-zero exit, never a traceback; a bad option
    or argument too, naming where the help is."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GlueError as exc:
            raise click.ClickException(str(exc)) from None
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "glue"
            raise UsageLine(f"{exc.format_message()} (see `{where} --help`)") from None


# The docs' path in the repository (and in the site `make docs` builds); tests/unit/test_docs_pointers.py checks it.
DOCS_LINE = "Docs: docs/index.md in the repository; `make docs` builds the site."


@click.group(cls=GlueGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=DOCS_LINE)
@click.version_option(package_name="gpukit")
def cli() -> None:
    """gpukit: keep GPU training jobs running on rented root-access GPU VMs."""


def _register() -> None:
    from glue.commands import cluster, image, memprobe, recovery, report, runs, watch

    for command in [*cluster.COMMANDS, *runs.COMMANDS, *recovery.COMMANDS, *memprobe.COMMANDS, *image.COMMANDS,
                    *watch.COMMANDS, *report.COMMANDS]:
        cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="glue")


if __name__ == "__main__":
    main()

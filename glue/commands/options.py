"""Parameter types shared by the commands: a bad number is one line from click, before anything runs."""

import click

POSITIVE_INT = click.IntRange(min=1)
POSITIVE_FLOAT = click.FloatRange(min=0, min_open=True)
NON_NEGATIVE = click.FloatRange(min=0)

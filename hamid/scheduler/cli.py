"""`hamid scheduler` command."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("scheduler")
def scheduler_command() -> None:
    """Not built yet."""
    raise not_built("scheduler")

"""`hamid apiserver` command (not built yet)."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("apiserver")
def apiserver_command() -> None:
    """Not built yet."""
    raise not_built("sim apiserver")

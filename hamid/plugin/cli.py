"""`hamid plugin` command."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("plugin")
def plugin_command() -> None:
    """Not built yet."""
    raise not_built("plugin")

"""`hamid demo` command (not built yet)."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("demo")
def demo_command() -> None:
    """Not built yet."""
    raise not_built("demo")

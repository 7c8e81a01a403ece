"""`hamid doctor`: check a node's prerequisites for NUMA alignment."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("doctor")
def doctor_command() -> None:
    """Not built yet."""
    raise not_built("doctor")

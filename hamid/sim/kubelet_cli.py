"""`hamid kubelet` command (not built yet)."""

from __future__ import annotations

import click

from hamid.options import not_built


@click.command("kubelet")
def kubelet_command() -> None:
    """Not built yet."""
    raise not_built("sim kubelet")

"""`hamid demo` and the `hamid sim` group."""

from __future__ import annotations

import click

from hamidsim.apiserver.cli import apiserver_command
from hamidsim.demo import demo_command
from hamidsim.kubelet_cli import kubelet_command
from hamidsim.up import up_command


@click.group("sim")
def sim_group() -> None:
    """Embedded stand-ins for a cluster: in-memory API server, simulated kubelet, a whole cluster (up)."""


sim_group.add_command(apiserver_command)
sim_group.add_command(kubelet_command)
sim_group.add_command(up_command)

__all__ = ["demo_command", "sim_group"]

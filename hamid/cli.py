"""The ``hamid`` command: one executable, one subcommand per mode."""

from __future__ import annotations

import click

from hamid import __version__, log
from hamid.doctor import doctor_command
from hamid.options import option
from hamid.plugin.cli import plugin_command
from hamid.scheduler.cli import scheduler_command
from hamid.sim.cli import demo_command, sim_group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    help="Log rendering: JSON lines, console, or auto (console on a terminal, JSON otherwise).",
)
@option(
    "--log-level",
    type=click.Choice(log.LOG_LEVELS, case_sensitive=False),
    default="info",
    help="Lowest level written to the log.",
)
def cli(log_format: log.LogFormat, log_level: str) -> None:
    """hamid: HAMi-compatible NVIDIA vGPU scheduling for Kubernetes, with NUMA alignment.

    \b
    Modes:
      scheduler  control plane: extender /filter /bind, webhook, NUMA refit
      plugin     every GPU node: kubelet device plugin, registration, refit client
      demo       the whole flow locally on embedded defaults (no cluster, no GPU)
      sim        embedded stand-ins: in-memory API server, simulated kubelet
      doctor     check a node's prerequisites for NUMA alignment
    """
    log.configure(log_format, log_level.lower())


@cli.command("version")
def version_command() -> None:
    """Print hamid's version."""
    click.echo(f"hamid {__version__}")


cli.add_command(scheduler_command)
cli.add_command(plugin_command)
cli.add_command(demo_command)
cli.add_command(sim_group)
cli.add_command(doctor_command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="hamid")

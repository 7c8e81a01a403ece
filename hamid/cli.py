"""The ``hamid`` command: one executable, one subcommand per mode.

Subcommands are imported only when invoked, so a node running ``hamid plugin`` does not pay for
the scheduler's or the simulator's modules.
"""

from __future__ import annotations

import importlib

import click

from hamid import __version__, log
from hamid.options import option

#: The simulator's import root: its own distribution (sim/), absent from production installs.
SIMULATOR_PACKAGE = "hamidsim"

#: subcommand name -> "module:attribute" of its click command.
LAZY_COMMANDS = {
    "scheduler": "hamid.scheduler.cli:scheduler_command",
    "plugin": "hamid.plugin.cli:plugin_command",
    "demo": "hamidsim.demo:demo_command",
    "sim": "hamidsim.cli:sim_group",
    "doctor": "hamid.doctor:doctor_command",
    "status": "hamid.status:status_command",
}


class LazyGroup(click.Group):
    """A click group whose subcommands in :data:`LAZY_COMMANDS` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != SIMULATOR_PACKAGE:
                raise
            raise click.UsageError(
                f"`hamid {cmd_name}` needs the simulator, which is not installed: "
                "pip install ./sim from a hamid checkout (or use the image's demo target)"
            ) from None
        command: click.Command = getattr(module, attribute)
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(__version__, "--version", prog_name="hamid", message="%(prog)s %(version)s")
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
      status     each GPU's allocated memory, cores and pods per node and NUMA node; recent refits
    """
    log.configure(log_format, log_level.lower())


@cli.command("version")
def version_command() -> None:
    """Print hamid's version."""
    click.echo(f"hamid {__version__}")


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="hamid")


def kubectl_main() -> None:
    """``kubectl-hamid``: the same commands as a kubectl plugin (``kubectl hamid status``), which
    kubectl finds on ``PATH`` and runs with the words after ``hamid``."""
    cli(prog_name="kubectl hamid")

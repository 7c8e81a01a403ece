"""`hamid scheduler` command: the flags of :class:`SchedulerOptions`, run by :class:`SchedulerApp`."""

from __future__ import annotations

import asyncio
import dataclasses

import click

from hamid.kube.errors import KubeError
from hamid.model.errors import InvalidInput
from hamid.options import OptionError, click_options, from_cli
from hamid.scheduler.app import run_scheduler
from hamid.scheduler.options import SchedulerOptions
from hamid.signals import stop_on_signals

__all__ = ["scheduler_command"]


async def _run_until_signal(options: SchedulerOptions) -> None:
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        await run_scheduler(options, stop=stop)


@click.command("scheduler")
@click_options(SchedulerOptions)
def scheduler_command(**values: object) -> None:
    """Run the scheduler extender, the mutating webhook and the metrics endpoint."""
    options = from_cli(SchedulerOptions, values)
    try:
        options.require_allocation_keys()
    except OptionError as exc:
        raise click.BadParameter(exc.reason, param_hint=exc.flag) from None
    # the process owns its heap: freeze the synced caches out of the cyclic GC
    options = dataclasses.replace(options, settings=dataclasses.replace(options.settings, gc_freeze=True))
    try:
        asyncio.run(_run_until_signal(options))
    except* (InvalidInput, KubeError) as group:
        raise click.ClickException("; ".join(str(e) for e in group.exceptions)) from None

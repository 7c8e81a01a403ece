"""Run until SIGINT or SIGTERM: one place that installs (and removes) the stop-signal handlers.

Every long-running command (``hamid scheduler``, ``hamid plugin``, the simulator's kubelet and
API server) stops cleanly on Ctrl-C or a pod's SIGTERM instead of dying with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator

from hamid.log import get_logger

log = get_logger("signals")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], object]) -> Iterator[None]:
    """Call ``stop`` on SIGINT/SIGTERM while the block runs (where the loop cannot: logged, no-op)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError, ValueError):
            log.debug("signal_handler_unavailable", signal=sig.name)
        else:
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


async def wait_for_signal() -> None:
    """Return once SIGINT or SIGTERM arrives."""
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        await stop.wait()


async def run_until_signal(work: Awaitable[object]) -> bool:
    """Await ``work`` until it ends or SIGINT/SIGTERM cancels it; True when a signal stopped it."""
    task = asyncio.ensure_future(work)
    with stop_on_signals(task.cancel):
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current is not None and current.cancelling()):
                raise
            return True
    return False

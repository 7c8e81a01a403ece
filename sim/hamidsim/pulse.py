"""A change signal that waiters re-check a condition on (simulator components' ``wait_until``)."""
# ruff: noqa: ASYNC109  -- a bounded wait is this module's whole purpose; callers pass the bound

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Pulse:
    """Wakes every waiter each time :meth:`fire` is called; waiters re-check their predicate."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        """Signal a change to everyone waiting now."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        """Wait until ``predicate()`` holds (checked on each change); TimeoutError after ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._event.wait()
        except TimeoutError as exc:
            raise TimeoutError(f"{what or 'condition'} not reached within {timeout:g}s") from exc

"""The scheduler's background work: owned tasks, and the Event outbox (never delays a decision).

:class:`Tasks` owns the coroutines a decision starts but does not wait for (an Event write, a refit
follow-up); :class:`EventOutbox` records Events through them, notes each in the bounded history the web
view reads, and turns the state's outboxes of untrusted allocations into Warning Events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from hamid.kube.events import EventRecorder, EventType
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.kube import Body
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.metrics import SchedulerMetrics

#: ``record(obj, type, reason, message)``: an Event (in the background, or kept in a history).
Record = Callable[[Body, EventType, str, str], None]
#: ``spawn(coro)``: run a coroutine in the background, owned by :class:`Tasks`.
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Tasks:
    """Background tasks owned by one scheduler: :meth:`spawn` starts one, :meth:`close` cancels all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, owned here (cancelled by :meth:`close`)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel every task still running and wait for them."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class EventOutbox:
    """Events of one scheduler, written in the background and kept (bounded) for the web view."""

    def __init__(
        self,
        events: EventRecorder,
        note: Record,
        spawn: Spawn,
        ledger: Ledger,
        metrics: SchedulerMetrics,
    ) -> None:
        self.events = events
        #: Keeps each Event recorded (the bounded history the web view reads).
        self._note = note
        self._spawn = spawn
        self._ledger = ledger
        self._metrics = metrics

    def record(self, obj: Body, event_type: EventType, reason: str, message: str) -> None:
        """Record an Event in the background (never delays or fails the caller)."""
        self._note(obj, event_type, reason, message)
        self._spawn(self.events.record(obj, event_type, reason, message))

    def report_untrusted(self) -> None:
        """Record a Warning Event (and count it) for each pod whose allocation annotations the
        state did not take: refused, foreign, undecodable, or disagreeing with its booking."""
        alloc = ann.DEVICES_ALLOCATED
        ledger = self._ledger
        for outbox, where, reason, text in (
            (ledger.refused, "booking", R.EVENT_ALLOCATION_REFUSED, f"{alloc} is not booked: {{}}"),
            (ledger.foreign, "foreign", R.EVENT_ALLOCATION_FOREIGN, f"{alloc} is not booked: {{}}"),
            (
                ledger.undecodable,
                "undecodable",
                R.EVENT_UNDECODABLE_ALLOCATION,
                f"{alloc} cannot be decoded ({{}}); it books nothing",
            ),
            (
                ledger.disagreed,
                "disagreement",
                R.EVENT_ALLOCATION_IGNORED,
                f"{alloc} changed after the scheduler booked the pod and is ignored: {{}}",
            ),
        ):
            while outbox:
                pod, why = outbox.pop()
                self._metrics.untrusted_annotations.labels(where).inc()
                self.record(pod, "Warning", reason, text.format(why))

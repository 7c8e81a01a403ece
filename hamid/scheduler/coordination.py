"""Per-node coordination of the scheduler's awaits: node guards, change waiters, outboxes.

Operations that must keep a node's plan stable across an await (a refit, a node-lock
acquisition) hold :meth:`Coordination.node_guard`, an in-process ``asyncio.Lock`` (not HAMi's
``hami.io/mutex.lock`` node lock on the Node object) — per node, never process-wide, so a slow API
server never stalls other nodes. A bind waiting for a node's lock to free waits on
:meth:`Coordination.wait_change`, woken by :meth:`Coordination.notify` whenever the node or a pod
placed on it changes. The outboxes collect what synchronous accounting code found to report
(Warning Events), for :class:`~hamid.scheduler.outbox.EventOutbox` to send from the event loop.
"""

from __future__ import annotations

import asyncio

from hamid.model.kube import PodBody


class Coordination:
    """Node guards, change waiters and the accounting's outboxes of one process (event-loop owned)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: Pods whose allocation annotations cannot be decoded, with the error (Warning Events).
        self.undecodable: list[tuple[PodBody, str]] = []
        #: Pods whose allocation annotations were not booked, with why (Warning Events).
        self.refused: list[tuple[PodBody, str]] = []
        #: Pods whose allocation this scheduler cannot prove it wrote (unsigned, mis-signed).
        self.foreign: list[tuple[PodBody, str]] = []
        #: Booked pods whose annotations now disagree with the booking (which stays as it is).
        self.disagreed: list[tuple[PodBody, str]] = []

    def node_guard(self, node: str) -> asyncio.Lock:
        """The guard of ``node``, an in-process lock (hold it across an await that must keep the plan)."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    def locked(self, node: str) -> bool:
        """Whether the node's in-process lock is held."""
        lock = self._locks.get(node)
        return lock is not None and lock.locked()

    def forget(self, node: str) -> None:
        """Drop a deleted node's lock unless held (a later use creates a fresh one)."""
        lock = self._locks.get(node)
        if lock is not None and not lock.locked():
            del self._locks[node]

    def notify(self, node: str) -> None:
        """Wake every :meth:`wait_change` waiter of ``node``."""
        for fut in self._waiters.pop(node, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_change(self, node: str, max_wait: float) -> bool:
        """Wait until the node (or a pod placed on it) changes; False when ``max_wait`` s passed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(node, set()).add(fut)
        try:
            async with asyncio.timeout(max(max_wait, 0.0)):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(node)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(node, None)

"""The scheduler's in-memory state: its ledger wired to the node inventory and the coordination.

:class:`SchedulerState` is the :class:`~hamid.scheduler.ledger.Ledger` of one scheduler process
over its :class:`~hamid.scheduler.inventory.NodeInventory` (nodes and their GPUs) and its
:class:`~hamid.scheduler.coordination.Coordination` (per-node locks, change waiters, outboxes):
it routes node events to the inventory, books the ledger's reservations on a node whose GPUs
were (re)registered, and wakes the node's waiters on every change. Everything is owned by the
event loop; mutations are synchronous (between awaits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from hamid.model import objects
from hamid.model.kube import NodeBody, PodBody, QuotaBody
from hamid.model.resources import ResourceConfig
from hamid.scheduler.coordination import Coordination
from hamid.scheduler.inventory import NodeEntry, NodeInventory, Registration
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.signing import AllocationKeys


class SchedulerState(Ledger):
    """Inventory, reservations and quotas of one scheduler process (event-loop owned)."""

    def __init__(
        self,
        config: ResourceConfig | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_name: str = "",
        keys: AllocationKeys | None = None,
        accept_unsigned: bool = False,
    ) -> None:
        config = config or ResourceConfig()
        super().__init__(
            config,
            clock,
            scheduler_name,
            inventory=NodeInventory(config, clock),
            coordination=Coordination(),
            keys=keys,
            accept_unsigned=accept_unsigned,
        )

    # -- node events ----------------------------------------------------------------------------

    def on_node(self, node: NodeBody) -> None:
        """Apply a node add/update: inventory, cordon, pair scores, handshake and allocatable."""
        name = objects.name(node)
        change = self.inventory.on_node(node)
        if change is Registration.FRESH:
            self.book_node(name)
        elif change is Registration.DROPPED:
            self.unbook_node(name)
        self.coordination.notify(name)

    def on_node_deleted(self, node: NodeBody) -> None:
        """Forget a deleted node's inventory (its pods' reservations stay until they go).

        Its in-process lock is dropped too unless held (a later use creates a fresh one).
        """
        name = objects.name(node)
        self.inventory.drop(name)
        self.unbook_node(name)
        self.inventory.handshake_wanted.discard(name)
        self.coordination.forget(name)
        self.coordination.notify(name)

    def on_quota(self, quota: QuotaBody) -> None:
        """Apply a ResourceQuota add/update (see :class:`~hamid.scheduler.quotas.QuotaBook`)."""
        self.quotas.on_quota(quota)

    def on_quota_deleted(self, quota: QuotaBody) -> None:
        """Forget a deleted ResourceQuota."""
        self.quotas.on_quota_deleted(quota)

    # -- views ----------------------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, NodeEntry]:
        """The registered nodes (the inventory's; read-only for callers)."""
        return self.inventory.nodes

    @property
    def membership(self) -> int:
        """Bumped whenever a node name joins or leaves :attr:`nodes`."""
        return self.inventory.membership

    @property
    def handshake_wanted(self) -> set[str]:
        """Nodes whose handshake annotation the leader must (re)write."""
        return self.inventory.handshake_wanted

    @property
    def undecodable(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods with an undecodable allocation and the error (Warning Events)."""
        return self.coordination.undecodable

    @property
    def refused(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods whose allocation annotations were not booked, with why (Warning Events)."""
        return self.coordination.refused

    @property
    def foreign(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods whose allocation is unsigned or mis-signed (not booked), with why."""
        return self.coordination.foreign

    @property
    def disagreed(self) -> list[tuple[PodBody, str]]:
        """Outbox: booked pods whose annotations now disagree with the booking, with why."""
        return self.coordination.disagreed

    def ranked(self) -> list[tuple[float, str]]:
        """``(node score, name)`` of every registered node, ascending (do not mutate)."""
        return self.inventory.ranked()

    def schedulable(self, name: str) -> NodeEntry | None:
        """The node's entry if it is registered and healthy now, else None."""
        return self.inventory.schedulable(name)

    def quota_namespaces(self) -> list[str]:
        """Namespaces with a GPU ResourceQuota (for metrics)."""
        return self.quotas.namespaces()

    # -- coordination ---------------------------------------------------------------------------

    def node_guard(self, node: str) -> asyncio.Lock:
        """The guard of ``node``, an in-process lock (hold it across an await that must keep the plan)."""
        return self.coordination.node_guard(node)

    def node_busy(self, node: str) -> bool:
        """Whether a refit or node-lock acquisition holds the node's lock, or a hold is booked on it."""
        return self.coordination.locked(node) or self.held_on(node)

    def notify(self, node: str) -> None:
        """Wake every :meth:`wait_change` waiter of ``node``."""
        self.coordination.notify(node)

    async def wait_change(self, node: str, max_wait: float) -> bool:
        """Wait until the node (or a pod placed on it) changes; False when ``max_wait`` s passed."""
        return await self.coordination.wait_change(node, max_wait)

"""The scheduler's in-memory state: its ledger, node inventory and coordination, wired together.

:class:`SchedulerState` owns the :class:`~hamid.scheduler.ledger.Ledger` of one scheduler process,
its :class:`~hamid.scheduler.inventory.NodeInventory` (nodes and their GPUs) and its
:class:`~hamid.scheduler.coordination.Coordination` (per-node locks, change waiters, outboxes), and
only routes node and quota events between them: a node's update goes to the inventory, the ledger
books its reservations on a node whose GPUs were (re)registered (unbooks them when they were
dropped), and the node's waiters wake on every change. Consumers get the ledger itself. Everything
is owned by the event loop; mutations are synchronous (between awaits).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hamid.model import objects
from hamid.model.kube import NodeBody, QuotaBody
from hamid.model.labels import EVERY_NODE, NodeLabelSelector
from hamid.model.resources import ResourceConfig
from hamid.scheduler.coordination import Coordination
from hamid.scheduler.inventory import NodeInventory, Registration
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.signing import AllocationKeys


class SchedulerState:
    """The ledger, inventory and coordination of one scheduler process, and their event routing."""

    def __init__(
        self,
        config: ResourceConfig | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_name: str = "",
        keys: AllocationKeys | None = None,
        accept_unsigned: bool = False,
        node_selector: NodeLabelSelector = EVERY_NODE,
    ) -> None:
        config = config or ResourceConfig()
        self.inventory = NodeInventory(config, clock, node_selector)
        self.coordination = Coordination()
        self.ledger = Ledger(
            config,
            clock,
            scheduler_name,
            inventory=self.inventory,
            coordination=self.coordination,
            keys=keys,
            accept_unsigned=accept_unsigned,
        )

    @property
    def clock(self) -> Callable[[], float]:
        """The ledger's clock (assigning it drives the ledger's holds and deletion marks)."""
        return self.ledger.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.ledger.clock = clock

    def on_node(self, node: NodeBody) -> None:
        """Apply a node add/update: inventory, cordon, pair scores, handshake and allocatable."""
        name = objects.name(node)
        change = self.inventory.on_node(node)
        if change is Registration.FRESH:
            self.ledger.book_node(name)
        elif change is Registration.DROPPED:
            self.ledger.unbook_node(name)
        self.coordination.notify(name)

    def on_node_deleted(self, node: NodeBody) -> None:
        """Forget a deleted node's inventory (its pods' reservations stay until they go).

        Its in-process lock is dropped too unless held (a later use creates a fresh one).
        """
        name = objects.name(node)
        self.inventory.on_node_deleted(name)
        self.ledger.unbook_node(name)
        self.coordination.forget(name)
        self.coordination.notify(name)

    def on_quota(self, quota: QuotaBody) -> None:
        """Apply a ResourceQuota add/update (see :class:`~hamid.scheduler.quotas.QuotaBook`)."""
        self.ledger.quotas.on_quota(quota)

    def on_quota_deleted(self, quota: QuotaBody) -> None:
        """Forget a deleted ResourceQuota."""
        self.ledger.quotas.on_quota_deleted(quota)

"""What the web view reads of the scheduler: narrow interfaces over its caches and ledgers.

The view never holds the scheduler: :class:`UiSource` names the few parts it reads (the GPU
ledger, the NUMA ledgers, the pod cache, the prediction counters, the Event history) by what
each must offer, so any of them can be built alone in a test or a benchmark. :class:`PodIndex`
is the view's own index of the pod cache by UID and node (bound, or booked by the filter and not
bound yet), fed by the cache's callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.kube import Pod, PodBody
from hamid.scheduler.inventory import NodeEntry
from hamid.scheduler.ledger import Reservation
from hamid.scheduler.numa_ledger import NodeNuma
from hamid.scheduler.ui.history import EventHistory

_TERMINAL_PHASES = ("Succeeded", "Failed")


class Bookings(Protocol):
    """The GPU ledger: registered nodes with live usage, and each pod's reservation."""

    clock: Callable[[], float]

    @property
    def nodes(self) -> Mapping[str, NodeEntry]: ...

    def reservation(self, uid: str) -> Reservation | None: ...


class NumaView(Protocol):
    """The NUMA ledgers: per node its profile, ledger and pod records."""

    @property
    def nodes(self) -> Mapping[str, NodeNuma]: ...


class Counted(Protocol):
    """A labelled counter whose metric families can be read (``prometheus_client.Counter``)."""

    def collect(self) -> Iterable[Any]: ...


class PredictionScores(Protocol):
    """The NUMA prediction counters of the scheduler's metrics."""

    @property
    def numa_predictions(self) -> Counted: ...

    @property
    def numa_prediction_misses(self) -> Counted: ...


class PodFeed(Protocol):
    """The pod cache: lookups by ``namespace/name`` and change callbacks."""

    def get(self, key: str) -> Pod | None: ...

    def add_handlers(
        self,
        on_add: Callable[[Pod], None] | None = None,
        on_update: Callable[[Pod, Pod], None] | None = None,
        on_delete: Callable[[Pod], None] | None = None,
    ) -> None: ...


class PodIndex:
    """The pod cache's pods by UID and by the node they are bound to (terminal pods left out), and
    the pending pods by the node the filter booked them on (``hami.io/vgpu-node``).

    Holds references to the cache's own (trimmed, read-only) pods: no copies.
    """

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, PodBody]] = {}
        self._node_of: dict[str, str] = {}
        self._pending: dict[str, PodBody] = {}
        #: Pending pods by the node the filter booked them on (their bind pending, slow or failing).
        self._booked: dict[str, dict[str, PodBody]] = {}
        self._booked_at: dict[str, str] = {}
        #: Per node with pods: the sequence number of its last change (never reused; absent: no pods).
        self._versions: dict[str, int] = {}
        self._seq = 0

    def follow(self, feed: PodFeed) -> None:
        """Keep this index from ``feed``'s callbacks (before the feed runs, to see its first list)."""
        feed.add_handlers(on_add=self.put, on_update=lambda _old, new: self.put(new), on_delete=self.drop)

    def put(self, pod: PodBody) -> None:
        """A pod added or changed."""
        uid = objects.uid(pod)
        if not uid:
            return
        self.drop(pod)
        if objects.section(pod, "status").get("phase") in _TERMINAL_PHASES:
            return
        node = str(objects.section(pod, "spec").get("nodeName") or "")
        if node:
            self._by_node.setdefault(node, {})[uid] = pod
            self._node_of[uid] = node
            self._bump(node)
            return
        self._pending[uid] = pod
        booked = objects.annotations(pod).get(ann.VGPU_NODE)
        if booked:
            self._booked.setdefault(booked, {})[uid] = pod
            self._booked_at[uid] = booked
            self._bump(booked)

    def drop(self, pod: PodBody) -> None:
        """A pod deleted (or about to be re-put)."""
        uid = objects.uid(pod)
        self._pending.pop(uid, None)
        for where, by_node in ((self._node_of, self._by_node), (self._booked_at, self._booked)):
            node = where.pop(uid, None)
            if node is None:
                continue
            self._bump(node)
            pods = by_node.get(node)
            if pods is not None:
                pods.pop(uid, None)
                if not pods:
                    del by_node[node]
            if node not in self._by_node and node not in self._booked:
                del self._versions[node]

    def _bump(self, node: str) -> None:
        self._seq += 1
        self._versions[node] = self._seq

    def version_of(self, node: str) -> int:
        """Changes whenever the pods bound to or booked on ``node`` change (0: it has none)."""
        return self._versions.get(node, 0)

    def on(self, node: str) -> list[PodBody]:
        """The pods bound to ``node``, by namespace/name."""
        return sorted(self._by_node.get(node, {}).values(), key=objects.namespaced_key)

    def on_unsorted(self, node: str) -> list[PodBody]:
        """The pods bound to ``node``, in no particular order."""
        return list(self._by_node.get(node, {}).values())

    def booked_on(self, node: str) -> list[PodBody]:
        """The pending pods the filter booked on ``node`` (its ``hami.io/vgpu-node``), by namespace/name."""
        return sorted(self._booked.get(node, {}).values(), key=objects.namespaced_key)

    def by_uid(self, uid: str) -> PodBody | None:
        """Pod ``uid``, bound or pending (a pod the filter placed is booked before it is bound)."""
        node = self._node_of.get(uid)
        return self._by_node.get(node, {}).get(uid) if node is not None else self._pending.get(uid)


@dataclass(frozen=True)
class UiSource:
    """Everything the web view reads (all owned by the scheduler; the view changes none of it)."""

    bookings: Bookings
    numa: NumaView
    pods: PodFeed
    index: PodIndex
    scores: PredictionScores
    history: EventHistory
    #: Whether this replica decides (a follower's ledgers follow the leader's writes).
    leading: Callable[[], bool] = lambda: True
    #: Whether the pod and node caches have applied their first list (before: no figures to show).
    synced: Callable[[], bool] = lambda: True

    def now(self) -> float:
        """The scheduler's clock."""
        return self.bookings.clock()

"""Rank a pending pod's shape while the scheduler is idle, before kube-scheduler asks for it.

The pod cache sees a pod when it is created; kube-scheduler sends it to ``/filter`` only after its
queue and its own plugins. Under the ``fgd`` node policy the costly step of a filter is bringing
the gain index of the pod's shape up to date (:meth:`~hamid.scheduler.fgd_rank.FgdRanker.ranking`:
every node for a shape's first pod or its first after a workload change, the nodes changed since
otherwise). :class:`FgdWarmup` does that step in between, one pod at a time, yielding to the event
loop after each, so the filter finds the index ready. The ranking is the same whoever brings it up
to date (the index holds each node's rank from its current state alone); a pod filtered first, or
bound, deleted or gone before its turn, costs nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hamid.fit.fgd import Shape
from hamid.fit.fit import PodFitSpec
from hamid.fit.policy import FGD
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.resources import ResourceConfig
from hamid.scheduler.fgd_rank import FgdRanker, shape_text
from hamid.scheduler.settings import SchedulerSettings

log = get_logger("scheduler.fgd")

#: Pending pods whose shape waits to be ranked; past this (or past the gain indexes the ranker
#: keeps, so a backlog does not push out what it ranked itself) the oldest is dropped: its filter
#: then ranks it itself.
_QUEUE_MAX = 256
#: With more pods waiting, the pause after each ranking: requests (a filter needs several event
#: loop turns) go first, not one turn per ranking.
_PAUSE_S = 0.002


class FgdWarmup:
    """The pending pods' shapes, ranked in idle time by :meth:`run` (event-loop owned)."""

    def __init__(
        self,
        ranker: FgdRanker,
        config: ResourceConfig,
        settings: SchedulerSettings,
        leading: Callable[[], bool],
        unregistered_nodes: Callable[[], bool],
    ) -> None:
        self.ranker = ranker
        #: Whether the cluster has nodes without hamid's GPUs: a CPU-only pod's filter then keeps
        #: those and ranks nothing (:func:`~hamid.scheduler.fgd_rank.fgd_cpu_only`).
        self.unregistered_nodes = unregistered_nodes
        self.config = config
        self.settings = settings
        self.leading = leading
        self._queue: dict[str, Shape] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def on_pod(self, pod: PodBody) -> None:
        """Queue a pod hamid will filter under ``fgd`` (pending, its scheduler, not terminating);
        drop a pod that was bound, finished or is going."""
        uid = objects.uid(pod)
        spec = objects.section(pod, "spec")
        pending = (
            not spec.get("nodeName")
            and spec.get("schedulerName") == self.settings.scheduler_name
            and objects.section(pod, "status").get("phase", "Pending") == "Pending"
            and not objects.metadata(pod).get("deletionTimestamp")
        )
        shape = self._shape(pod) if pending and uid and self.leading() else None
        if shape is None:
            self._queue.pop(uid, None)
            return
        bound = min(_QUEUE_MAX, self.ranker.index_capacity())
        while uid not in self._queue and len(self._queue) >= bound:
            del self._queue[next(iter(self._queue))]
        self._queue[uid] = shape
        self._idle.clear()
        self._wake.set()

    def on_pod_gone(self, pod: PodBody) -> None:
        """A deleted pod needs no ranking."""
        self._queue.pop(objects.uid(pod), None)

    def _shape(self, pod: PodBody) -> Shape | None:
        """The pod's shape when its node policy is ``fgd`` (None otherwise, or unreadable)."""
        s = self.settings
        try:
            spec = PodFitSpec.from_pod(pod, self.config, s.gpu_policy, s.node_policy)
            if spec.policy.node_policy != FGD:
                return None
            shape = self.ranker.shape_of(pod, spec)
        except InvalidInput:
            return None
        return None if not shape.gpus and self.unregistered_nodes() else shape

    async def run(self) -> None:
        """Rank the queued shapes, one pod at a time, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                uid = next(iter(self._queue))
                shape = self._queue.pop(uid)
                if self.leading():
                    try:
                        self.ranker.ranking(shape, self.ranker.inventory.nodes)
                    except Exception:  # never the scheduler's end: the pod's filter ranks it, and says why
                        log.exception("fgd_warmup_failed", pod_uid=uid, shape=shape_text(shape))
                await asyncio.sleep(_PAUSE_S if self._queue else 0)
            self._idle.set()

    async def idle(self) -> None:
        """Wait until every queued pod's shape is ranked (benchmarks and tests)."""
        await self._idle.wait()

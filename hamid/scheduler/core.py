"""The scheduler engine: the state fed by the watch caches, and the verbs and loops over it.

:class:`Scheduler` is built by the composition root, :class:`hamid.scheduler.app.SchedulerApp`
(benchmarks and unit tests build it alone). It assembles its parts from the settings once: the
:class:`~hamid.scheduler.state.SchedulerState` (node and quota events into its
:class:`~hamid.scheduler.ledger.Ledger`, which the consumers get) and the NUMA, CPU/memory and
``fgd`` views fed by the pod, node and ResourceQuota caches (:meth:`Scheduler._pod_seen` & co); the
extender verbs
(:class:`~hamid.scheduler.filter.Filter` over its plan and reserve step,
:class:`~hamid.scheduler.bind.Binder`) sharing one :class:`~hamid.scheduler.verbs.VerbContext`;
admission (:class:`~hamid.scheduler.webhook.Admission`); the handshake loop, the reconcile and the
Event outbox. Whether it may decide is its :class:`~hamid.scheduler.readiness.Readiness`, written
by :mod:`hamid.scheduler.ha`. Consumers receive the parts they use, never the scheduler (HTTP:
:mod:`hamid.scheduler.http`; ``/refit``: :class:`hamid.scheduler.refit.handler.RefitHost`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

from hamid.kube.cache import NodeCache, PodCache, ResourceQuotaCache, WatchCache
from hamid.kube.client import KubeClient
from hamid.kube.events import EventRecorder
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.kube import Body, NodeBody, PodBody
from hamid.model.resources import DeviceConfig
from hamid.scheduler.bind import Binder
from hamid.scheduler.bind_backoff import BindBackoff
from hamid.scheduler.fgd_rank import FgdRanker
from hamid.scheduler.fgd_warmup import FgdWarmup
from hamid.scheduler.filter import Filter
from hamid.scheduler.filter_plan import Planner
from hamid.scheduler.filter_reserve import Reserver
from hamid.scheduler.handshake import Handshakes
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.nodelock import NodeLocker
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.outbox import EventOutbox, Tasks
from hamid.scheduler.podtrim import trim_scheduler_pod
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.reconcile import Reconciler
from hamid.scheduler.settings import DEFAULT_SCHEDULER_NAME, SchedulerSettings
from hamid.scheduler.signing import AllocationKeys
from hamid.scheduler.state import SchedulerState
from hamid.scheduler.ui.history import EventHistory
from hamid.scheduler.verbs import VerbContext
from hamid.scheduler.webhook import Admission

__all__ = ["DEFAULT_SCHEDULER_NAME", "Scheduler", "SchedulerSettings", "freeze_heap"]

log = get_logger("scheduler")


def freeze_heap() -> None:
    """Collect once, then move every live object to the GC's permanent generation (``gc.freeze``).

    The synced caches and state are long-lived; left in the collector, each full collection walks
    all of them (hundreds of ms at 10,000 pods) and stalls whichever filter it lands in. Frozen
    objects are still freed by reference counting when dropped; only cycles among them are not.
    """
    gc.collect()
    gc.freeze()


class Scheduler:
    """The engine of one replica: its parts over one :class:`SchedulerState`'s ledger (event-loop owned)."""

    def __init__(
        self,
        kube: KubeClient,
        device_config: DeviceConfig | None = None,
        settings: SchedulerSettings | None = None,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.time,
        *,
        keys: AllocationKeys | None = None,
        accept_unsigned: bool = False,
        annotation_writers: frozenset[str] = frozenset(),
    ) -> None:
        self.kube = kube
        self.config = (device_config or DeviceConfig()).resources
        self.settings = s = settings or SchedulerSettings()
        self.state = SchedulerState(
            self.config,
            clock,
            scheduler_name=s.scheduler_name,
            keys=keys,
            accept_unsigned=accept_unsigned,
            node_selector=s.node_label_selector,
        )
        #: The ledger every consumer gets (the state only routes node and quota events into it).
        self.ledger = self.state.ledger
        #: Per-node, per-NUMA ledgers (exclusive CPUs, replicas) for the NUMA predictor.
        self.numa = NumaLedgers(
            s.scheduler_name,
            self.config.resource_count_name,
            lambda: self.ledger.clock(),
            self._numa_scored,
            booked_on=self._booked_on,
        )
        #: CPU and memory per node, and the ``fgd`` policy's workload and fragmentation memo.
        self.cpu_mem = NodeCpuMem()
        self.fgd = FgdRanker(
            self.config, self.ledger.inventory, self.numa, self.cpu_mem, s.fgd_workload, s.fgd_half_life
        )
        #: Ranks a pending pod's shape under ``fgd`` in idle time, before its filter.
        self.fgd_warmup = FgdWarmup(
            self.fgd,
            self.config,
            s,
            lambda: self.readiness.leading,
            lambda: len(self.nodes) > len(self.ledger.nodes),
        )
        self.metrics = SchedulerMetrics(self.ledger, self.fgd, pod_of=lambda key: self.pods.get(key))
        self.tasks = Tasks()
        #: The refit and fit-failure Events recorded here, bounded (the web view reads them).
        self.history = EventHistory(lambda: self.ledger.clock())
        self.outbox = EventOutbox(
            events or EventRecorder(kube, DEFAULT_SCHEDULER_NAME),
            self.history.note,
            self.tasks.spawn,
            self.ledger,
            self.metrics,
        )
        self.pods = PodCache(kube, trim=trim_scheduler_pod)
        self.nodes = NodeCache(kube)
        self.quotas = ResourceQuotaCache(kube)
        self._watch_caches()
        #: Whether this replica may decide (written by hamid.scheduler.ha.Leadership only).
        self.readiness = Readiness(lambda: self.synced)
        self.admission = Admission(
            self.config,
            s.scheduler_name,
            self.ledger.fit_quota,
            annotation_writers,
            self.metrics.untrusted_annotations,
            s.schedule_cpu_pods,
            s.force_overwrite_default_scheduler,
        )
        self._build_verbs()
        self.handshakes = Handshakes(
            self.ledger,
            kube,
            self.readiness,
            interval_s=s.handshake_interval_s,
            api_timeout_s=s.api_timeout_s,
        )
        self.reconciler = Reconciler(self)

    def _watch_caches(self) -> None:
        """Feed the state (and the NUMA ledgers) from the pod, node and ResourceQuota caches."""
        self.pods.add_handlers(on_add=self._pod_seen, on_update=self._pod_updated, on_delete=self._pod_gone)
        self.nodes.add_handlers(
            on_add=self._node_seen,
            on_update=lambda _old, new: self._node_seen(new),
            on_delete=self._node_gone,
        )
        state = self.state
        self.quotas.add_handlers(
            on_add=state.on_quota,
            on_update=lambda _old, new: state.on_quota(new),
            on_delete=state.on_quota_deleted,
        )

    def _build_verbs(self) -> None:
        """The extender verbs over one shared context: the filter's plan and reserve step, the bind."""
        s = self.settings
        #: Nodes whose binds failed lately: the filter tries them last.
        self.bind_backoff = BindBackoff(self.ledger.clock)
        context = VerbContext(
            ledger=self.ledger,
            kube=self.kube,
            config=self.config,
            settings=s,
            pods=self.pods,
            backoff=self.bind_backoff,
            metrics=self.metrics,
            readiness=self.readiness,
            record=self.outbox.record,
        )
        self.planner = Planner(self.ledger, self.numa, self.fgd, self.bind_backoff, self.config)
        self.reserver = Reserver(context, self.numa, self.cpu_mem)
        self.filtering = Filter(context, self.planner, self.reserver)
        self.locker = NodeLocker(
            self.kube,
            self.ledger,
            node_of=self.nodes.get,
            pod_of=lambda ns, name: (self.pods.get(f"{ns}/{name}"), self.pods.synced),
            timeout=s.node_lock_timeout,
            call_timeout=s.api_timeout_s,
            max_hold=s.node_lock_max_hold,
            stall=s.node_lock_stall,
        )
        self.binder = Binder(context, self.nodes, self.locker, self.numa)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def caches(self) -> tuple[WatchCache[Body], ...]:
        """The pod, node and ResourceQuota caches the state is fed from."""
        return (self.pods, self.nodes, self.quotas)

    @property
    def synced(self) -> bool:
        """Whether every cache has applied its first list."""
        return self.pods.synced and self.nodes.synced and self.quotas.synced

    async def wait_synced(self) -> None:
        """Wait until every cache has applied its first list."""
        for cache in self.caches:
            await cache.wait_synced()

    @property
    def leading(self) -> bool:
        """Whether this replica decides (see :attr:`readiness`)."""
        return self.readiness.leading

    @property
    def binding(self) -> set[str]:
        """UIDs of pods whose bind is in flight (the reconcile leaves their reservations alone)."""
        return self.binder.in_flight

    @property
    def reconcile_interval_s(self) -> float:
        """Seconds between reconciles (0: never)."""
        return self.settings.reconcile_interval_s

    def not_ready_reason(self) -> str:
        """Why the scheduler must not decide now ("" when ready)."""
        return self.readiness.reason()

    def report_untrusted(self) -> None:
        """Warning Events for allocations the state did not take (:meth:`EventOutbox.report_untrusted`)."""
        self.outbox.report_untrusted()

    async def run(self) -> None:
        """Run the caches and the handshake loop until cancelled (each task owned here)."""
        try:
            async with asyncio.TaskGroup() as tg:
                for cache in self.caches:
                    tg.create_task(cache.run())
                tg.create_task(self.handshakes.run())
                tg.create_task(self.fgd_warmup.run())
                if self.settings.reconcile_interval_s > 0:
                    tg.create_task(self.reconciler.run())
                if self.settings.gc_freeze:
                    tg.create_task(self._freeze_after_sync())
        finally:
            await self.close()

    async def _freeze_after_sync(self) -> None:
        await self.wait_synced()
        freeze_heap()
        log.info("heap_frozen_after_sync", frozen_objects=gc.get_freeze_count())

    def shutdown(self) -> None:
        """Stop deciding: new decisions are refused, binds waiting for a node lock answered now."""
        self.readiness.stop()
        self.binder.close()

    async def drain(self) -> None:
        """End the binds still running (after the listeners' grace), undoing their writes, while
        this replica still leads."""
        await self.binder.drain()

    async def close(self) -> None:
        """Cancel background tasks (Event writes, refit follow-ups)."""
        await self.tasks.close()

    # -- cache callbacks --------------------------------------------------------------------------

    def _booked_on(self, uid: str) -> str | None:
        reservation = self.ledger.reservation(uid)
        return reservation.node if reservation is not None else None

    def _pod_seen(self, pod: PodBody) -> None:
        self.ledger.on_pod(pod)
        self.numa.on_pod(pod)
        self.cpu_mem.on_pod(pod)
        self.fgd.observe(pod)
        self.fgd_warmup.on_pod(pod)
        self.outbox.report_untrusted()

    def _pod_updated(self, _old: PodBody, new: PodBody) -> None:
        self._pod_seen(new)

    def _pod_gone(self, pod: PodBody) -> None:
        self.ledger.on_pod_deleted(pod)
        self.numa.on_pod_deleted(pod)
        self.cpu_mem.on_pod_deleted(pod)
        self.fgd.forget(pod)
        self.fgd_warmup.on_pod_gone(pod)

    def _node_seen(self, node: NodeBody) -> None:
        self.state.on_node(node)
        entry = self.ledger.nodes.get(objects.name(node))
        self.numa.on_node(node, entry.infos if entry is not None else None)
        self.cpu_mem.on_node(node)

    def _node_gone(self, node: NodeBody) -> None:
        self.state.on_node_deleted(node)
        self.numa.on_node_deleted(objects.name(node))
        self.cpu_mem.on_node_deleted(objects.name(node))
        self.fgd.forget_node(objects.name(node))

    def _numa_scored(self, result: str, cause: str) -> None:
        self.metrics.numa_predictions.labels(result).inc()
        if cause:
            self.metrics.numa_prediction_misses.labels(cause).inc()

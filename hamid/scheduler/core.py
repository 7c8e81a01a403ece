"""The scheduler's composition root: state, caches, verbs and background loops, wired once.

:class:`Scheduler` owns the :class:`~hamid.scheduler.state.SchedulerState`, feeds it from the
watch caches (pods, nodes, ResourceQuotas), and hands the extender verbs their collaborators:
:class:`~hamid.scheduler.filter.Filter` and :class:`~hamid.scheduler.bind.Binder` (admission is
:mod:`hamid.scheduler.webhook`). Whether it may decide is its
:class:`~hamid.scheduler.readiness.Readiness`, written by :mod:`hamid.scheduler.ha`. HTTP
lives in :mod:`hamid.scheduler.http`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hamid.fit.fgd import DEFAULT_HALF_LIFE, Workload
from hamid.kube.cache import NodeCache, PodCache, ResourceQuotaCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.kube.events import EventRecorder, EventType
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.resources import DeviceConfig
from hamid.scheduler.bind import DEFAULT_BIND_WAIT_S, Binder
from hamid.scheduler.bind_backoff import BindBackoff
from hamid.scheduler.extender_json import BindArgs, FilterArgs, FilterResult
from hamid.scheduler.fgd_rank import FgdRanker
from hamid.scheduler.filter import Filter
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.nodelock import DEFAULT_MAX_HOLD, DEFAULT_STALL, NodeLocker
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.podtrim import trim_scheduler_pod
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.reconcile import Reconciler
from hamid.scheduler.signing import AllocationKeys
from hamid.scheduler.state import JSON, SchedulerState
from hamid.scheduler.ui.history import EventHistory
from hamid.scheduler.webhook import Verdict, review_pod, review_update

__all__ = ["DEFAULT_SCHEDULER_NAME", "Scheduler", "SchedulerSettings", "freeze_heap"]

log = get_logger("scheduler")

#: HAMi's scheduler name: the schedulerName the webhook sets, the name of kube-scheduler's Lease,
#: and the component hamid's Events report (as HAMi's scheduler does).
DEFAULT_SCHEDULER_NAME = "hami-scheduler"


@dataclass(frozen=True)
class SchedulerSettings:
    """Options of ``hamid scheduler`` that shape decisions."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    node_lock_timeout: timedelta = timedelta(minutes=5)
    #: Hard cap of a node lock held by a Pending, unallocated pod (``--node-lock-max-hold``).
    node_lock_max_hold: timedelta = DEFAULT_MAX_HOLD
    #: A Pending holder that made no progress this long loses the node lock (None: never).
    node_lock_stall: timedelta | None = DEFAULT_STALL
    bind_wait_s: float = DEFAULT_BIND_WAIT_S
    api_timeout_s: float = 5.0
    handshake_interval_s: float = 15.0
    #: Seconds between reconciles of the accounting against a fresh pod list (0: never).
    reconcile_interval_s: float = 300.0
    #: After the first cache sync, take the live heap out of the cyclic GC (:func:`freeze_heap`).
    #: For the ``hamid scheduler`` process; off where the scheduler is embedded (tests, simulator).
    gc_freeze: bool = False
    #: The ``fgd`` policy's typical workload, pinned by the operator (None: learned online).
    fgd_workload: Workload | None = None
    #: Pods after which a learned shape weighs half as much as a new one (``fgd``).
    fgd_half_life: float = DEFAULT_HALF_LIFE
    #: The webhook also sets ``scheduler_name`` on pods without GPUs (``--schedule-cpu-pods``).
    schedule_cpu_pods: bool = False


def freeze_heap() -> None:
    """Collect once, then move every live object to the GC's permanent generation (``gc.freeze``).

    The synced caches and state are long-lived; left in the collector, each full collection walks
    all of them (hundreds of ms at 10,000 pods) and stalls whichever filter it lands in. Frozen
    objects are still freed by reference counting when dropped; only cycles among them are not.
    """
    gc.collect()
    gc.freeze()


class Scheduler:
    """Filter, bind and admission over one :class:`SchedulerState` (event-loop owned)."""

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
        #: Usernames the webhook lets change scheduler-owned pod annotations (scheduler, plugin).
        self.annotation_writers = annotation_writers
        self.device_config = device_config or DeviceConfig()
        self.config = self.device_config.resources
        self.settings = settings or SchedulerSettings()
        self.state = SchedulerState(
            self.config,
            clock,
            scheduler_name=self.settings.scheduler_name,
            keys=keys,
            accept_unsigned=accept_unsigned,
        )
        self.metrics = SchedulerMetrics(self.state)
        #: Per-node, per-NUMA ledgers (exclusive CPUs, replicas) for the NUMA predictor.
        self.numa = NumaLedgers(
            self.settings.scheduler_name,
            self.config.resource_count_name,
            lambda: self.state.clock(),
            self._numa_scored,
        )
        #: CPU and memory per node, and the ``fgd`` policy's workload and fragmentation memo.
        self.cpu_mem = NodeCpuMem()
        self.fgd = FgdRanker(
            self.config,
            self.state.inventory,
            self.numa,
            self.cpu_mem,
            self.settings.fgd_workload,
            self.settings.fgd_half_life,
        )
        self.events = events or EventRecorder(kube, DEFAULT_SCHEDULER_NAME)
        #: The refit and fit-failure Events recorded here, bounded (the web view reads them).
        self.history = EventHistory(lambda: self.state.clock())
        self.pods = PodCache(kube, trim=trim_scheduler_pod)
        self.nodes = NodeCache(kube)
        self.quotas = ResourceQuotaCache(kube)
        self._watch_caches()
        #: Whether this replica may decide (written by hamid.scheduler.ha.Leadership only).
        self.readiness = Readiness(lambda: self.synced)
        self.locker = NodeLocker(
            kube,
            self.state,
            node_of=self.nodes.get,
            pod_of=lambda ns, name: (self.pods.get(f"{ns}/{name}"), self.pods.synced),
            timeout=self.settings.node_lock_timeout,
            call_timeout=self.settings.api_timeout_s,
            max_hold=self.settings.node_lock_max_hold,
            stall=self.settings.node_lock_stall,
        )
        #: Nodes whose binds failed lately: the filter tries them last.
        self.bind_backoff = BindBackoff(self.state.clock)
        self._tasks: set[asyncio.Task[None]] = set()
        self.filtering = self._filtering()
        self.binder = self._binder()
        self.reconciler = Reconciler(self)

    def _watch_caches(self) -> None:
        """Feed the state (and the NUMA ledgers) from the pod, node and ResourceQuota caches."""
        self.pods.add_handlers(on_add=self._pod_seen, on_update=self._pod_updated, on_delete=self._pod_gone)
        self.nodes.add_handlers(
            on_add=self._node_seen,
            on_update=lambda _old, new: self._node_seen(new),
            on_delete=self._node_gone,
        )
        quotas = self.state.quotas
        self.quotas.add_handlers(
            on_add=quotas.on_quota,
            on_update=lambda _old, new: quotas.on_quota(new),
            on_delete=quotas.on_quota_deleted,
        )

    def _filtering(self) -> Filter:
        s = self.settings
        return Filter(
            state=self.state,
            numa=self.numa,
            kube=self.kube,
            config=self.config,
            gpu_policy=s.gpu_policy,
            node_policy=s.node_policy,
            api_timeout_s=s.api_timeout_s,
            pods=self.pods,
            backoff=self.bind_backoff,
            metrics=self.metrics,
            readiness=self.readiness,
            record=self.record,
            fgd=self.fgd,
        )

    def _binder(self) -> Binder:
        s = self.settings
        return Binder(
            state=self.state,
            kube=self.kube,
            config=self.config,
            gpu_policy=s.gpu_policy,
            node_policy=s.node_policy,
            api_timeout_s=s.api_timeout_s,
            bind_wait_s=s.bind_wait_s,
            pods=self.pods,
            nodes=self.nodes,
            locker=self.locker,
            backoff=self.bind_backoff,
            metrics=self.metrics,
            readiness=self.readiness,
            record=self.record,
        )

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether every cache has applied its first list."""
        return self.pods.synced and self.nodes.synced and self.quotas.synced

    @property
    def leading(self) -> bool:
        """Whether this replica decides (see :attr:`readiness`)."""
        return self.readiness.leading

    @property
    def term_synced(self) -> bool:
        """False from the start of a leadership term until the caches have caught up in it."""
        return self.readiness.term_synced

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

    async def run(self) -> None:
        """Run the caches and the handshake loop until cancelled (each task owned here)."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.pods.run())
                tg.create_task(self.nodes.run())
                tg.create_task(self.quotas.run())
                tg.create_task(self._handshake_loop())
                if self.settings.reconcile_interval_s > 0:
                    tg.create_task(self.reconciler.run())
                if self.settings.gc_freeze:
                    tg.create_task(self._freeze_after_sync())
        finally:
            await self.close()

    async def _freeze_after_sync(self) -> None:
        for cache in (self.pods, self.nodes, self.quotas):
            await cache.wait_synced()
        freeze_heap()
        log.info("heap_frozen_after_sync", frozen_objects=gc.get_freeze_count())

    def shutdown(self) -> None:
        """Stop deciding: new decisions are refused, binds waiting for a node lock answered now."""
        self.readiness.stop()
        self.binder.close()

    async def close(self) -> None:
        """Cancel background event tasks."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, owned here (cancelled by :meth:`close`)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def record(self, obj: JSON, event_type: EventType, reason: str, message: str) -> None:
        """Record an Event in the background (never delays or fails the caller)."""
        self.history.note(obj, event_type, reason, message)
        self.spawn(self.events.record(obj, event_type, reason, message))

    # -- the verbs ------------------------------------------------------------------------------

    async def filter(self, args: FilterArgs) -> FilterResult:
        """The extender filter verb (:meth:`hamid.scheduler.filter.Filter.filter`)."""
        return await self.filtering.filter(args)

    async def bind(self, args: BindArgs) -> str:
        """The extender bind verb (:meth:`hamid.scheduler.bind.Binder.bind`); never raises."""
        return await self.binder.bind(args)

    # -- cache callbacks --------------------------------------------------------------------------

    def _pod_seen(self, pod: JSON) -> None:
        self.state.on_pod(pod)
        self.numa.on_pod(pod)
        self.cpu_mem.on_pod(pod)
        self.fgd.observe(pod)
        self.report_undecodable()

    def _pod_updated(self, _old: JSON, new: JSON) -> None:
        self._pod_seen(new)

    def _pod_gone(self, pod: JSON) -> None:
        self.state.on_pod_deleted(pod)
        self.numa.on_pod_deleted(pod)
        self.cpu_mem.on_pod_deleted(pod)
        self.fgd.forget(pod)

    def _node_seen(self, node: JSON) -> None:
        self.state.on_node(node)
        entry = self.state.nodes.get(objects.name(node))
        self.numa.on_node(node, entry.infos if entry is not None else None)
        self.cpu_mem.on_node(node)

    def _node_gone(self, node: JSON) -> None:
        self.state.on_node_deleted(node)
        self.numa.on_node_deleted(objects.name(node))
        self.cpu_mem.on_node_deleted(objects.name(node))
        self.fgd.forget_node(objects.name(node))

    def _numa_scored(self, result: str, cause: str) -> None:
        self.metrics.numa_predictions.labels(result).inc()
        if cause:
            self.metrics.numa_prediction_misses.labels(cause).inc()

    def report_undecodable(self) -> None:
        """Record a Warning Event (and count it) for each pod whose allocation annotations the
        state did not take: refused, foreign, undecodable, or disagreeing with its booking."""
        alloc = ann.DEVICES_ALLOCATED
        for outbox, where, reason, text in (
            (self.state.refused, "booking", R.EVENT_ALLOCATION_REFUSED, f"{alloc} is not booked: {{}}"),
            (self.state.foreign, "foreign", R.EVENT_ALLOCATION_FOREIGN, f"{alloc} is not booked: {{}}"),
            (
                self.state.undecodable,
                "undecodable",
                R.EVENT_UNDECODABLE_ALLOCATION,
                f"{alloc} cannot be decoded ({{}}); it books nothing",
            ),
            (
                self.state.disagreed,
                "disagreement",
                R.EVENT_ALLOCATION_IGNORED,
                f"{alloc} changed after the scheduler booked the pod and is ignored: {{}}",
            ),
        ):
            while outbox:
                pod, why = outbox.pop()
                self.metrics.untrusted_annotations.labels(where).inc()
                self.record(pod, "Warning", reason, text.format(why))

    async def _handshake_loop(self) -> None:
        while True:
            if not self.not_ready_reason():  # only the leader writes handshakes
                await self.write_handshakes()
            await asyncio.sleep(self.settings.handshake_interval_s)

    async def write_handshakes(self) -> None:
        """Write ``Requesting_<now>`` on registered nodes whose handshake is missing or stale-format."""
        for name in sorted(self.state.handshake_wanted):
            if name not in self.state.nodes:
                continue
            value = ann.format_handshake(datetime.now())
            try:
                await self.kube.patch_node_metadata(
                    name, annotations={ann.NODE_HANDSHAKE: value}, timeout=self.settings.api_timeout_s
                )
                self.state.handshake_wanted.discard(name)
            except KubeError as exc:
                log.warning("handshake_write_failed", node=name, error=str(exc))

    # -- admission --------------------------------------------------------------------------------

    def admit(self, pod: JSON, namespace: str) -> Verdict:
        """The webhook verdict for a pod (quota precheck against the live state)."""
        settings = self.settings
        return review_pod(
            pod,
            self.config,
            settings.scheduler_name,
            self.state.fit_quota,
            namespace,
            settings.schedule_cpu_pods,
        )

    def scheduler_owned_removed(self, pod: JSON, keys: tuple[str, ...]) -> None:
        """Count and log the scheduler-owned keys the webhook removed from a pod being created."""
        self.metrics.untrusted_annotations.labels("webhook").inc()
        generate_name = objects.metadata(pod).get("generateName", "")
        name = f"{objects.namespace(pod)}/{objects.name(pod) or generate_name}"
        log.warning("scheduler_owned_annotations_removed", pod=name, keys=list(keys))

    def judge_update(self, old: Any, pod: JSON, username: Any) -> Verdict:
        """The webhook's UPDATE verdict (:func:`review_update`); a denial is counted and logged."""
        verdict = review_update(old, pod, username, self.annotation_writers, self.settings.scheduler_name)
        if not verdict.allowed:
            self.metrics.untrusted_annotations.labels("webhook_denied").inc()
            log.warning("scheduler_owned_change_denied", pod=objects.namespaced_key(pod), why=verdict.message)
        return verdict

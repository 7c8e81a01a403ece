"""Periodic reconcile of the scheduler's accounting against a fresh list of pods.

The state is fed by watch events; a dropped delete or update (a watch gap, a bug) would leave a
GPU booked or free for good (HAMi #2923, #1458). Every ``--reconcile-interval`` the leader, with
its term synced, LISTs pods from the API server (not the cache), lets the cache catch up with the
list, feeds the listed pods through the state's own pod-event code into a *shadow* state holding
the same nodes and the live bookings of the listed pods (so the list is judged by the same trust
rules as a watch event: a booking changes only as that event would change it, never to an
annotation that disagrees with it), and compares it with the live state per pod UID (node,
allocation, init release, booked amounts) and per GPU (slots, MiB, cores). Each difference is
logged, counted in ``hamid_reconcile_drift_total{kind}`` and repaired to the shadow's view in
synchronous code (no await between the comparison and the repair).

A pod is left alone when the list may be older than what the state knows of it: its reservation
is pending (the filter's patch is in flight), a bind or refit holds it (or its node's lock), it
changed after the list was requested (booked, moved, confirmed or released), its delete was
already applied, or the state applied a version newer than the list's resourceVersion. A
reservation whose pod the list lacks is released only when it is older than the list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from prometheus_client import Counter, Histogram

from hamid.fit.usage import DeviceAmount, DeviceUsage
from hamid.kube.cache import PodCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.kube import Pod, PodBody
from hamid.scheduler.ledger import Ledger, Reservation

log = get_logger("scheduler.reconcile")

#: The list implies a reservation the state lacks (a dropped add or update).
DRIFT_MISSING = "missing"
#: The state's reservation differs from what the pod's annotations and phase imply.
DRIFT_CHANGED = "changed"
#: The state books a pod that is gone, finished or no longer placed (a dropped delete).
DRIFT_LEAKED = "leaked"
#: A GPU's usage differs from the sum of the reservations placed on it.
DRIFT_GPU = "gpu"
DRIFT_KINDS = (DRIFT_MISSING, DRIFT_CHANGED, DRIFT_LEAKED, DRIFT_GPU)

#: Deadline of the whole paginated LIST of pods.
LIST_TIMEOUT_S = 60.0
#: How long the pod cache may take to apply the events up to the list's resourceVersion.
CATCH_UP_S = 2.0
_CATCH_UP_POLL_S = 0.05

#: GPU UUID -> (slots, MiB, cores) the state held minus what the list implies.
Difference = dict[str, tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference between the live state and the fresh list, as found (before the repair)."""

    kind: str
    node: str
    pod: str = ""
    uid: str = ""
    gpu: str = ""
    held: str = ""
    listed: str = ""
    difference: Difference = field(default_factory=dict)


@dataclass(slots=True)
class ReconcileReport:
    """What one reconcile run compared, skipped and repaired."""

    list_version: str
    pods: int = 0
    reservations: int = 0
    skipped: int = 0
    gpus: int = 0
    drifts: list[Drift] = field(default_factory=list)


def _signature(res: Reservation) -> tuple[object, ...]:
    return (res.node, res.raw, res.init_released, res.kinds, res.applied)


def _describe(res: Reservation | None) -> str:
    return "nothing" if res is None else f"{res.node}: {res.raw}"


def _difference(held: Mapping[str, DeviceAmount], listed: Mapping[str, DeviceAmount]) -> Difference:
    out: Difference = {}
    for uuid in sorted(held.keys() | listed.keys()):
        a, b = held.get(uuid), listed.get(uuid)
        delta = (
            (max(a.slots, 1) if a else 0) - (max(b.slots, 1) if b else 0),
            (a.mem if a else 0) - (b.mem if b else 0),
            (a.cores if a else 0) - (b.cores if b else 0),
        )
        if delta != (0, 0, 0):
            out[uuid] = delta
    return out


def _left_alone(
    ledger: Ledger,
    uid: str,
    live: Reservation | None,
    want: Reservation | None,
    list_version: str,
    since: int,
    busy: frozenset[str],
) -> bool:
    """Whether the list may be older than what the state knows of pod ``uid`` (see module doc)."""
    if uid in busy or ledger.changed_since(uid, since) or ledger.was_deleted(uid):
        return True
    if live is not None and (live.pending or objects.newer_than(live.version, list_version)):
        return True
    return any(res is not None and ledger.node_busy(res.node) for res in (live, want))


def _gpu_drifts(
    node: str, held_devices: Sequence[DeviceUsage], listed_devices: Sequence[DeviceUsage]
) -> list[Drift]:
    """One :data:`DRIFT_GPU` per GPU whose held usage differs from what the listed pods imply."""
    drifts: list[Drift] = []
    for have, want_dev in zip(held_devices, listed_devices, strict=True):
        held = (have.used, have.usedmem, have.usedcores)
        expected = (want_dev.used, want_dev.usedmem, want_dev.usedcores)
        if held != expected:
            drifts.append(
                Drift(
                    kind=DRIFT_GPU,
                    node=node,
                    gpu=have.id,
                    held=f"slots={held[0]} MiB={held[1]} cores={held[2]}",
                    listed=f"slots={expected[0]} MiB={expected[1]} cores={expected[2]}",
                    difference={
                        have.id: (held[0] - expected[0], held[1] - expected[1], held[2] - expected[2])
                    },
                )
            )
    return drifts


def _judge(
    ledger: Ledger,
    shadow: Ledger,
    listed: Mapping[str, PodBody],
    report: ReconcileReport,
    since: int,
    busy: frozenset[str],
) -> None:
    """Compare each pod's live reservation with the shadow's and repair the differing ones."""
    live_uids = {res.uid for res in ledger.reservations()}
    want_uids = {res.uid for res in shadow.reservations()}
    report.reservations = len(want_uids)
    for uid in sorted(live_uids | want_uids):
        live, want = ledger.reservation(uid), shadow.reservation(uid)
        if live is not None and want is not None and _signature(live) == _signature(want):
            continue
        if _left_alone(ledger, uid, live, want, report.list_version, since, busy):
            report.skipped += 1
            shadow.adopt(live, uid)
            continue
        listed_pod = listed.get(uid)
        if live is not None:
            kind, some = (DRIFT_CHANGED if want is not None else DRIFT_LEAKED), live
        elif want is not None:
            kind, some = DRIFT_MISSING, want
        else:
            continue
        report.drifts.append(
            Drift(
                kind=kind,
                node=some.node,
                pod=some.key,
                uid=uid,
                held=_describe(live),
                listed=_describe(want) if listed_pod is not None else "pod not listed",
                difference=_difference(live.applied if live else {}, want.applied if want else {}),
            )
        )
        if listed_pod is not None:
            ledger.adopt(want, uid)
            for res in (live, want):
                if res is not None:
                    ledger.notify(res.node)
        else:
            ledger.on_pod_deleted({"metadata": {"uid": uid, "namespace": some.namespace, "name": some.name}})


def _judge_gpus(ledger: Ledger, shadow: Ledger, report: ReconcileReport) -> None:
    """Compare each GPU's live usage with the shadow's; recompute a differing node's usage."""
    listed_nodes = shadow.inventory.nodes
    for name, entry in ledger.nodes.items():
        if ledger.node_busy(name):
            continue
        drifts = _gpu_drifts(name, entry.usage.devices, listed_nodes[name].usage.devices)
        report.gpus += len(entry.usage.devices)
        if drifts:
            report.drifts.extend(drifts)
            ledger.rebuild_usage(name)


def reconcile_state(
    ledger: Ledger,
    pods: Iterable[PodBody],
    list_version: str,
    since: int,
    busy: frozenset[str] = frozenset(),
    cached: Callable[[str], PodBody | None] | None = None,
) -> ReconcileReport:
    """Compare ``state`` with the reservations ``pods`` imply and repair it (synchronous).

    ``pods`` is a fresh list at ``list_version``, requested when ``ledger.seq`` was ``since``;
    ``busy`` holds the UIDs of pods a bind or refit holds; ``cached`` looks a pod up in the cache
    by its key (``namespace/name``). Pods are fed to a shadow ledger with
    the same nodes, quotas and holds (:meth:`~hamid.scheduler.ledger.Ledger.blank_copy`) through its
    :meth:`~hamid.scheduler.ledger.Ledger.on_pod`, each starting from its live booking; a differing
    reservation is repaired to the shadow's with :meth:`~hamid.scheduler.ledger.Ledger.adopt` (or
    :meth:`~hamid.scheduler.ledger.Ledger.on_pod_deleted` when the pod is not listed), then each
    GPU's usage is compared with the shadow's (which mirrors the reservations left alone) and a
    differing node is recomputed from its reservations.
    """
    listed = {uid: pod for pod in pods if (uid := objects.uid(pod))}
    # A refit whose patch outcome was unknown left a hold for the pod's next update: the list
    # decides it as an event would (or, past its time bound, as not applied), before the shadow
    # copies the holds left.
    for uid in ledger.settle_holds(list_version, listed):
        ledger.on_pod(_newest(listed[uid], cached))
    shadow = ledger.blank_copy()
    for uid in listed:
        shadow.adopt(ledger.reservation(uid), uid)
    for pod in _feed_order(ledger, listed.values()):
        try:
            shadow.on_pod(pod)
        except Exception:
            # As the cache's callbacks do: one pod the ledger cannot read must not end the
            # reconcile (nor, through its TaskGroup, the scheduler); the shadow keeps the live
            # booking, so nothing of it is repaired.
            log.exception("reconcile_pod_unreadable", pod=objects.namespaced_key(pod))
    report = ReconcileReport(list_version, pods=len(listed))
    _judge(ledger, shadow, listed, report, since, busy)
    _judge_gpus(ledger, shadow, report)
    ledger.prune_marks(since, listed)
    return report


def _newest(listed: PodBody, cached: Callable[[str], PodBody | None] | None) -> PodBody:
    """The listed pod, or the cache's copy of it where that is newer: a list must not undo what
    the cache already applied (a pod that finished after the list was taken is not booked again)."""
    copy = cached(objects.object_key(listed)) if cached is not None else None
    if copy is None or objects.uid(copy) != objects.uid(listed):
        return listed
    newer = objects.version_at_least(objects.resource_version(listed), objects.resource_version(copy))
    return copy if newer is False else listed


def _feed_order(ledger: Ledger, pods: Iterable[PodBody]) -> list[PodBody]:
    """The listed pods in the order the shadow judges them: first those bound, or booked here as
    their annotations name, then those naming another allocation than booked, then those neither
    bound nor booked. An allocation that replaces a booking, or a first one of a pod not yet bound
    (a write that landed after this replica refused or undid it), is judged by the shadow against
    what every other listed pod holds (their live bookings are adopted before any pod is fed), not
    against whatever the list put before it: in list order such writes were adopted past a GPU's
    capacity."""
    kept: list[PodBody] = []
    replacing: list[PodBody] = []
    unheld: list[PodBody] = []
    for pod in pods:
        res = ledger.reservation(objects.uid(pod))
        if res is not None:
            named = objects.annotations(pod)
            same = (named.get(ann.VGPU_NODE), named.get(ann.DEVICES_ALLOCATED)) == (res.node, res.raw)
            (kept if same else replacing).append(pod)
        else:
            (kept if objects.section(pod, "spec").get("nodeName") else unheld).append(pod)
    return kept + replacing + unheld


class ReconcileMetrics(Protocol):
    """The scheduler metrics a reconcile writes."""

    @property
    def reconcile_runs(self) -> Counter: ...

    @property
    def reconcile_seconds(self) -> Histogram: ...

    @property
    def reconcile_drift(self) -> Counter: ...


class ReconcileHost(Protocol):
    """What a reconcile needs of its scheduler (:class:`~hamid.scheduler.core.Scheduler` is one)."""

    @property
    def ledger(self) -> Ledger: ...

    @property
    def kube(self) -> KubeClient: ...

    @property
    def pods(self) -> PodCache: ...

    @property
    def binding(self) -> set[str]: ...

    @property
    def metrics(self) -> ReconcileMetrics: ...

    @property
    def reconcile_interval_s(self) -> float: ...

    def not_ready_reason(self) -> str: ...

    def report_untrusted(self) -> None: ...


class Reconciler:
    """The scheduler's periodic reconcile (``run`` is owned by :meth:`Scheduler.run`'s TaskGroup)."""

    def __init__(
        self,
        scheduler: ReconcileHost,
        *,
        list_timeout_s: float = LIST_TIMEOUT_S,
        catch_up_s: float = CATCH_UP_S,
    ) -> None:
        self.scheduler = scheduler
        self.list_timeout_s = list_timeout_s
        self.catch_up_s = catch_up_s

    async def run(self) -> None:
        """Reconcile every ``settings.reconcile_interval_s`` seconds until cancelled (0: never)."""
        interval = self.scheduler.reconcile_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reconcile_once()
            except (KubeError, TimeoutError) as exc:
                log.warning("reconcile_failed", error=str(exc) or type(exc).__name__)
            except Exception:
                # A periodic repair that fails must not stop the scheduler it repairs: the next
                # interval tries again.
                log.exception("reconcile_failed")

    async def _catch_up(self, list_version: str) -> bool:
        """Wait (bounded) until the pod cache applied events up to ``list_version``."""
        cache = self.scheduler.pods
        if objects.version_number(list_version) is None:
            return False  # an unorderable list version: nothing to wait for
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.catch_up_s
        while True:
            if objects.version_at_least(cache.resource_version, list_version):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(_CATCH_UP_POLL_S, remaining))

    async def reconcile_once(self) -> ReconcileReport | None:
        """One run: None when this replica must not decide now (follower, term not synced)."""
        s = self.scheduler
        reason = s.not_ready_reason()
        if reason:
            log.debug("reconcile_skipped", reason=reason)
            return None
        started = time.perf_counter()
        try:
            since = s.ledger.seq
            cache = s.pods
            items: list[Pod] = []
            list_version = ""
            async with asyncio.timeout(self.list_timeout_s):
                async for page, version in s.kube.list_pages(
                    cache.resource,
                    cache.namespace,
                    field_selector=cache.field_selector,
                    label_selector=cache.label_selector,
                    page_size=cache.page_size,
                    timeout=self.list_timeout_s,
                ):
                    list_version = version
                    items.extend(map(cache.record, page))  # trimmed as the cache keeps pods
            caught_up = await self._catch_up(list_version)
            reason = s.not_ready_reason()
            if reason:
                log.info("reconcile_abandoned", reason=reason)
                return None
            # from here to the return: no await (the comparison and the repair see one ledger)
            report = reconcile_state(
                s.ledger, items, list_version, since, frozenset(s.binding), cached=cache.get
            )
            cache.forget_missing({objects.object_key(item) for item in items}, list_version)
        except Exception:
            s.metrics.reconcile_runs.labels("failed").inc()
            raise
        finally:
            s.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        for drift in report.drifts:
            s.metrics.reconcile_drift.labels(drift.kind).inc()
            where = {"node": drift.node, "pod": drift.pod} if drift.pod else {"node": drift.node}
            with structlog.contextvars.bound_contextvars(**where):
                log.warning(
                    "reconcile_drift",
                    kind=drift.kind,
                    uid=drift.uid or None,
                    gpu=drift.gpu or None,
                    held=drift.held,
                    listed=drift.listed,
                    difference={k: list(v) for k, v in drift.difference.items()},
                )
        s.report_untrusted()
        s.metrics.reconcile_runs.labels("repaired" if report.drifts else "clean").inc()
        log.info(
            "reconcile_done",
            list_version=list_version,
            pods=report.pods,
            reservations=report.reservations,
            skipped=report.skipped,
            gpus=report.gpus,
            drifts=len(report.drifts),
            cache_caught_up=caught_up,
        )
        return report

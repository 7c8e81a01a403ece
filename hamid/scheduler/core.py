"""The scheduler's operations: filter, bind, admission, wired to the state, caches and API.

:class:`Scheduler` owns the :class:`~hamid.scheduler.state.SchedulerState`, feeds it from the
watch caches (pods, nodes, ResourceQuotas), and implements the extender verbs. HTTP lives in
:mod:`hamid.scheduler.http`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Coroutine, Hashable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, timedelta
from typing import Any

from hamid.fit.fit import Fitted, PodFitSpec, Quota, Unfit, fit_pod, room_needed
from hamid.fit.numa_fit import numa_targets, pod_shape
from hamid.fit.numa_predict import Outcome, Prediction
from hamid.fit.policy import best_first
from hamid.kube.cache import NodeCache, PodCache, ResourceQuotaCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound, outcome_unknown
from hamid.kube.events import EventRecorder, EventType
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.alignment import AlignmentMode, parse_alignment
from hamid.model.errors import InvalidInput
from hamid.model.numa import NUMA_PREDICTED, encode_prediction
from hamid.model.resources import DeviceConfig, init_container_count
from hamid.scheduler.bind_backoff import BindBackoff
from hamid.scheduler.extender_json import BindArgs, FilterArgs, FilterResult
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.nodelock import (
    DEFAULT_MAX_HOLD,
    DEFAULT_STALL,
    Holder,
    LockContention,
    NodeLocker,
    holder_state,
)
from hamid.scheduler.numa_ledger import UNKNOWN, NumaLedgers
from hamid.scheduler.reconcile import Reconciler
from hamid.scheduler.state import (
    JSON,
    NodeEntry,
    Reservation,
    SchedulerState,
    pod_key,
    pod_uid,
    trim_scheduler_pod,
)
from hamid.scheduler.webhook import Verdict, review_pod

log = get_logger("scheduler")

#: How long a bind waits for a contended node lock (well inside kube-scheduler's 30 s httpTimeout).
DEFAULT_BIND_WAIT_S = 25.0
#: The whole budget of one /bind (lock wait and every API call): kube-scheduler's extender
#: httpTimeout is 30 s; the rest is margin for the HTTP exchange itself.
BIND_BUDGET_S = 27.0
#: Part of the budget the lock wait leaves for the annotation patch, the Binding and an undo.
_BIND_AFTER_LOCK_S = 8.0
#: Part of the budget the forward calls leave for undoing a failed bind (pod read, lock release,
#: bind-phase removal).
_BIND_UNDO_S = 3.0
#: The shortest timeout a bind's API call gets when its budget is nearly spent.
_MIN_CALL_S = 0.5
_MAX_FAILED_EVENTS = 5
#: After a best-effort fit off the predicted NUMA node, how many more nodes the filter tries for
#: an aligned fit before taking it (a fallback scores below any aligned fit, within this window).
_FALLBACK_LOOKAHEAD = 4


@dataclass(frozen=True)
class SchedulerSettings:
    """Options of ``hamid scheduler`` that shape decisions."""

    scheduler_name: str = "hami-scheduler"
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
    ) -> None:
        self.kube = kube
        self.device_config = device_config or DeviceConfig()
        self.config = self.device_config.resources
        self.settings = settings or SchedulerSettings()
        self.state = SchedulerState(self.config, scheduler_name=self.settings.scheduler_name)
        self.metrics = SchedulerMetrics(self.state)
        #: Per-node, per-NUMA ledgers (exclusive CPUs, replicas) for the NUMA predictor.
        self.numa = NumaLedgers(
            self.settings.scheduler_name,
            self.config.resource_count_name,
            lambda: self.state.clock(),
            self._numa_scored,
        )
        self.events = events or EventRecorder(kube, "hami-scheduler")
        self.pods = PodCache(kube, trim=trim_scheduler_pod)
        self.nodes = NodeCache(kube)
        self.quotas = ResourceQuotaCache(kube)
        self.pods.add_handlers(on_add=self._pod_seen, on_update=self._pod_updated, on_delete=self._pod_gone)
        self.nodes.add_handlers(
            on_add=self._node_seen,
            on_update=lambda _old, new: self._node_seen(new),
            on_delete=self._node_gone,
        )
        self.quotas.add_handlers(
            on_add=self.state.on_quota,
            on_update=lambda _old, new: self.state.on_quota(new),
            on_delete=self.state.on_quota_deleted,
        )
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
        #: Whether this replica decides; with ``term_synced`` managed by hamid.scheduler.ha.Leadership.
        self.leading: bool = True
        #: False from the start of a leadership term until the caches have caught up in it.
        self.term_synced: bool = True
        self._tasks: set[asyncio.Task[None]] = set()
        self._candidates: _Candidates | None = None
        #: UIDs of pods whose bind is in flight (the reconcile leaves their reservations alone).
        self.binding: set[str] = set()
        self.reconciler = Reconciler(self)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether every cache has applied its first list."""
        return self.pods.synced and self.nodes.synced and self.quotas.synced

    def not_ready_reason(self) -> str:
        """Why the scheduler must not decide now ("" when ready)."""
        if not self.synced:
            return "caches not synced"
        if not self.leading:
            return "not the leader"
        if not self.term_synced:
            return "cache of this term not synced yet"
        return ""

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

    async def close(self) -> None:
        """Cancel background event tasks."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def record(self, obj: JSON, event_type: EventType, reason: str, message: str) -> None:
        """Record an Event in the background (never delays or fails the caller)."""
        self._spawn(self.events.record(obj, event_type, reason, message))

    # -- cache callbacks --------------------------------------------------------------------------

    def _pod_seen(self, pod: JSON) -> None:
        self.state.on_pod(pod)
        self.numa.on_pod(pod)
        self.report_undecodable()

    def _pod_updated(self, _old: JSON, new: JSON) -> None:
        self._pod_seen(new)

    def _pod_gone(self, pod: JSON) -> None:
        self.state.on_pod_deleted(pod)
        self.numa.on_pod_deleted(pod)

    def _node_seen(self, node: JSON) -> None:
        self.state.on_node(node)
        entry = self.state.nodes.get(str((node.get("metadata") or {}).get("name") or ""))
        self.numa.on_node(node, entry.infos if entry is not None else None)

    def _node_gone(self, node: JSON) -> None:
        self.state.on_node_deleted(node)
        self.numa.on_node_deleted(str((node.get("metadata") or {}).get("name") or ""))

    def _numa_scored(self, result: str, cause: str) -> None:
        self.metrics.numa_predictions.labels(result).inc()
        if cause:
            self.metrics.numa_prediction_misses.labels(cause).inc()

    def report_undecodable(self) -> None:
        """Record a Warning Event for each pod the state found with an undecodable or refused allocation."""
        while self.state.refused:
            pod, why = self.state.refused.pop()
            self.metrics.untrusted_annotations.labels("booking").inc()
            self.record(
                pod,
                "Warning",
                R.EVENT_ALLOCATION_REFUSED,
                f"{ann.DEVICES_ALLOCATED} is not booked: {why}; only allocations hamid's scheduler "
                "made for the GPUs a pod requests are served",
            )
        while self.state.undecodable:
            pod, error = self.state.undecodable.pop()
            self.record(
                pod,
                "Warning",
                R.EVENT_UNDECODABLE_ALLOCATION,
                f"{ann.DEVICES_ALLOCATED} cannot be decoded ({error}); its GPUs are blocked until fixed",
            )

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

    # -- filter -----------------------------------------------------------------------------------

    async def filter(self, args: FilterArgs) -> FilterResult:
        """The extender filter verb: fit, reserve, patch (undo on failure), answer one node."""
        started = time.perf_counter()
        try:
            result = await self._filter(args)
        finally:
            self.metrics.filter_seconds.observe(time.perf_counter() - started)
        self.metrics.filter_results.labels(
            "error" if result.error else "fit" if _chosen(result) else "unfit"
        ).inc()
        return result

    def plan(
        self, pod: JSON, spec: PodFitSpec, names: tuple[str, ...], numa: NumaFit | None = None
    ) -> tuple[str | None, Fitted | None, dict[str, str]]:
        """Choose a node for ``pod`` among ``names`` (pure over the state; nothing changes).

        The node chosen is the one fitting every candidate and picking the best would choose
        (best node score for the policy, ties to the earliest candidate), with work proportional
        to the nodes ahead of it: nodes are walked best-first from the state's score index, a
        node whose :meth:`~hamid.fit.usage.NodeUsage.room` is below the pod's need is passed
        over without a fit, and the first node that fits wins. Failed-node reasons are HAMi's:
        when nothing fits every candidate gets its reason; when a node fits, the unregistered
        candidates and the nodes fitted before the winner get theirs (kube-scheduler reads
        them only when no node passes). With ``numa`` every node fitted is first predicted
        (:meth:`_fit`): a fit off the predicted NUMA node wins only if no aligned fit follows
        within :data:`_FALLBACK_LOOKAHEAD` nodes. Returns (node, fit, failed-node reasons).
        """
        uid = pod_uid(pod)
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        state = self.state
        previous = state.reservation(uid)
        quota = state.fit_quota(namespace, exclude_uid=uid)
        nodes = state.nodes
        now = state.clock()
        position, unregistered = self._positions(names)
        failed = dict.fromkeys(unregistered, R.NODE_UNREGISTERED)
        # A re-filtered pod sees its own booking on its node as free: that node's score differs
        # from the index's, so it is ranked on its own.
        own: tuple[float, str] | None = None
        if previous is not None and previous.node in position and previous.node in nodes:
            own = (nodes[previous.node].usage.score(previous.applied), previous.node)
        passed: list[NodeEntry] = []  # best-first; fitted only when no other node fits
        backing_off = self.bind_backoff.active(now, nodes)
        fallback: tuple[str, Fitted] | None = None
        after_fallback = 0

        def attempt(entry: NodeEntry) -> tuple[str, Fitted] | None:
            nonlocal fallback, after_fallback
            result, aligned = self._fit(entry, spec, quota, previous, numa)
            if not isinstance(result, Fitted):
                failed[entry.name] = result.reason
            elif aligned:
                return entry.name, result
            elif fallback is None:
                fallback = (entry.name, result)
            if fallback is not None:
                after_fallback += 1
                if after_fallback > _FALLBACK_LOOKAHEAD:
                    return fallback
            return None

        own_node = own[1] if own is not None else None
        need = room_needed(spec)
        for group in best_first(state.ranked(), spec.policy.node_policy, position, own):
            tries = _triage(group, nodes, now, backing_off, own_node, need, failed, passed)
            for entry in tries:
                won = attempt(entry)
                if won is not None:
                    return won[0], won[1], failed
        last = [nodes[n] for n in sorted(backing_off, key=backing_off.__getitem__) if n not in failed]
        for entry in passed + [e for e in last if e.name in position]:
            won = attempt(entry)
            if won is not None:
                return won[0], won[1], failed
        if fallback is not None:
            return fallback[0], fallback[1], failed
        return None, None, failed

    def _positions(self, names: tuple[str, ...]) -> tuple[Mapping[str, int], tuple[str, ...]]:
        """Each candidate's request position (first occurrence) and the unregistered candidates.

        kube-scheduler sends the same node list filter after filter: the answer is kept until the
        list or the set of registered nodes changes, so a filter does not rebuild it.
        """
        membership = self.state.membership
        cached = self._candidates
        if (
            cached is not None
            and cached.membership == membership
            and (cached.names is names or cached.names == names)
        ):
            return cached.position, cached.unregistered
        position = dict(zip(reversed(names), range(len(names) - 1, -1, -1), strict=True))
        unregistered = tuple(position.keys() - self.state.nodes.keys())
        self._candidates = _Candidates(names, membership, position, unregistered)
        return position, unregistered

    def _fit(
        self,
        entry: NodeEntry,
        spec: PodFitSpec,
        quota: Quota | None,
        previous: Reservation | None,
        numa: NumaFit | None = None,
    ) -> tuple[Fitted | Unfit, bool]:
        """Fit the pod on one node, within the NUMA node kubelet is predicted to choose.

        Returns the fit and whether it is aligned with the prediction (True also when there is no
        definite prediction). ``reject`` and a ``strict`` pod that cannot be aligned are
        ``NumaPredictedNotFit``; a best-effort (or not opted-in) pod falls back to any GPU.
        """
        release = previous.applied if previous is not None and previous.node == entry.name else None
        if numa is None:
            return fit_pod(entry.usage, spec, quota, release), True
        prediction = numa.predict(self.numa, entry.name)
        if prediction is None or prediction.outcome is Outcome.UNKNOWN:
            return fit_pod(entry.usage, spec, quota, release), True
        if prediction.outcome is Outcome.REJECT:
            return Unfit(R.NUMA_PREDICTED_NOT_FIT), True
        targets = numa_targets(prediction, self.config.resource_count_name, len(spec.requests))
        if all(t is None for t in targets):
            return fit_pod(entry.usage, spec, quota, release), True
        within = fit_pod(entry.usage, spec, quota, release, targets)
        if isinstance(within, Fitted):
            return within, True
        if numa.mode is AlignmentMode.STRICT:
            return Unfit(R.NUMA_PREDICTED_NOT_FIT), True
        return fit_pod(entry.usage, spec, quota, release), False

    async def _filter(self, args: FilterArgs) -> FilterResult:
        pod = args.pod
        try:
            spec = PodFitSpec.from_pod(pod, self.config, self.settings.gpu_policy, self.settings.node_policy)
        except InvalidInput as exc:
            return FilterResult(error=str(exc))
        if not spec.wants_gpu:
            return FilterResult(
                node_names=list(args.node_names) if args.node_names is not None else None,
                nodes=list(args.nodes) if args.nodes is not None else None,
            )
        reason = self.not_ready_reason()
        if reason:
            return FilterResult(error=f"scheduler not ready: {reason}")
        uid = pod_uid(pod)
        meta = pod["metadata"]
        refusal = _filter_refusal(pod, self.pods.get(pod_key(pod)))
        if refusal:
            return FilterResult(error=refusal)
        name = pod_key(pod)
        numa = NumaFit.of(pod, uid)
        node, fitted, failed = self.plan(pod, spec, args.candidate_names, numa)
        if node is None or fitted is None:
            self._record_unfit(pod, failed)
            return FilterResult(failed_nodes=failed)
        raw = ann.encode_pod_devices(fitted.devices)
        annotations: dict[str, str | None] = {
            ann.VGPU_NODE: node,
            ann.VGPU_TIME: str(int(time.time())),
            ann.DEVICES_TO_ALLOCATE: raw,
            ann.DEVICES_ALLOCATED: raw,
        }
        prediction = numa.predictions.get(node)
        predicted = self._prediction_annotation(node, prediction)
        if predicted is not None or NUMA_PREDICTED in (meta.get("annotations") or {}):
            annotations[NUMA_PREDICTED] = predicted
        undo = self.state.reserve(pod, node, fitted.devices, raw)
        undo_numa = None
        if predicted is not None and prediction is not None:
            undo_numa = self.numa.book(uid, node, prediction, pod)
        try:
            await self.kube.patch_pod_metadata(
                meta["namespace"],
                meta["name"],
                annotations=annotations,
                labels={ann.VGPU_NODE: node},
                uid=uid,
                timeout=self.settings.api_timeout_s,
            )
        except Exception as exc:  # any failure (API or not) leaves no reservation behind
            undo()
            if undo_numa is not None:
                undo_numa()
            log.warning("filter_patch_failed", pod=name, node=node, error=str(exc))
            return FilterResult(error=f"patching pod {name} failed: {exc}")
        self.state.confirm(uid)
        self.record(
            pod,
            "Normal",
            R.EVENT_FILTERING_SUCCEED,
            f"find fit node({node}), {len(failed)} nodes not fit, 1 nodes fit({node}:{fitted.score:.2f})",
        )
        if prediction is not None and prediction.outcome is Outcome.UNKNOWN:
            self.metrics.numa_predictions.labels(UNKNOWN).inc()
        log.info("filter_fit", pod=name, node=node, devices=raw, numa=_describe(prediction))
        if args.nodes is not None:
            chosen = [n for n in args.nodes if (n.get("metadata") or {}).get("name") == node]
            return FilterResult(nodes=chosen, failed_nodes=failed)
        return FilterResult(node_names=[node], failed_nodes=failed)

    def _prediction_annotation(self, node: str, prediction: Prediction | None) -> str | None:
        """The ``hamid.io/numa-predicted`` value of a placed prediction on ``node`` (None otherwise)."""
        if prediction is None or prediction.outcome is not Outcome.PLACED:
            return None
        profile = self.numa.nodes[node].profile
        return encode_prediction(prediction.record(profile.generation)) if profile is not None else None

    def _record_unfit(self, pod: JSON, failed: dict[str, str]) -> None:
        by_reason: dict[str, list[str]] = {}
        for node, reason in failed.items():
            by_reason.setdefault(reason, []).append(node)
        for reason, nodes in sorted(by_reason.items())[:_MAX_FAILED_EVENTS]:
            message = f"{len(nodes)} nodes {reason}({', '.join(sorted(nodes))})"
            self.record(pod, "Warning", R.EVENT_FILTERING_FAILED, message)
        if not failed:
            self.record(pod, "Warning", R.EVENT_FILTERING_FAILED, "no candidate nodes")

    # -- bind -------------------------------------------------------------------------------------

    async def bind(self, args: BindArgs) -> str:
        """The extender bind verb; returns the error message ("" on success), never raises.

        Everything fits in :data:`BIND_BUDGET_S` (inside kube-scheduler's 30 s httpTimeout).
        """
        started = time.perf_counter()
        self.binding.add(args.pod_uid)
        try:
            error = await self._bind(args, asyncio.get_running_loop().time() + BIND_BUDGET_S)
        except Exception as exc:  # an answer in-band, never a 500: kube-scheduler retries the pod
            log.exception("bind_error", pod=f"{args.pod_namespace}/{args.pod_name}", node=args.node)
            error = f"binding pod {args.pod_namespace}/{args.pod_name} to {args.node} failed: {exc!r}"
        finally:
            self.binding.discard(args.pod_uid)
        self.metrics.bind_seconds.labels("error" if error else "ok").observe(time.perf_counter() - started)
        return error

    def _call_timeout(self, deadline: float, keep: float = 0.0) -> float:
        """An API call's timeout: the API timeout, shortened so ``keep`` s of the budget remain."""
        remaining = deadline - asyncio.get_running_loop().time() - keep
        return max(min(self.settings.api_timeout_s, remaining), _MIN_CALL_S)

    async def _bind_target(self, args: BindArgs, deadline: float) -> tuple[JSON | None, str]:
        """The pod a bind goes on with, or None and the answer ("" for a replay of a done bind).

        Nothing is released for a pod or node that does not exist but the named pod's own booking.
        """
        key = f"{args.pod_namespace}/{args.pod_name}"
        reason = self.not_ready_reason()
        if reason:
            return None, f"scheduler not ready: {reason}"
        pod = self.pods.get(key)
        if pod is None:
            try:
                pod = await self.kube.get_pod(
                    args.pod_namespace,
                    args.pod_name,
                    timeout=self._call_timeout(deadline, _BIND_AFTER_LOCK_S),
                )
            except NotFound:
                res = self.state.reservation(args.pod_uid)
                if res is not None and res.key == key:  # only the named pod's own booking
                    self.state.release(args.pod_uid)
                return None, f"pod {key} not found"
            except KubeError as exc:
                return None, f"reading pod {key} failed: {exc}"
        if pod_uid(pod) != args.pod_uid:
            return None, f"pod {key} has uid {pod_uid(pod)}, not {args.pod_uid}"
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and bound != args.node:
            return None, f"pod {key} is already bound to {bound}, not {args.node}"
        if bound and holder_state(pod, args.node) is Holder.DONE:
            # A replay for a pod already running (or allocated, finished): nothing to do, and the
            # node lock is not taken again. A bound pod still waiting for Allocate goes on: the
            # lock is its own (re-entrant) and stays for the plugin.
            log.info("bind_replayed", pod=key, node=args.node)
            return None, ""
        if self.nodes.get(args.node) is None and args.node not in self.state.nodes:
            self.record(pod, "Warning", R.EVENT_BINDING_FAILED, f"node {args.node} not found")
            return None, f"node {args.node} not found"
        return pod, ""

    async def _bind(self, args: BindArgs, deadline: float) -> str:
        key = f"{args.pod_namespace}/{args.pod_name}"
        pod, answer = await self._bind_target(args, deadline)
        if pod is None:
            return answer
        needs_lock = self._needs_lock(pod)
        if needs_lock:
            res = self.state.reservation(args.pod_uid)
            if res is None or res.node != args.node:
                message = f"pod {key} has no GPU reservation on node {args.node}; filter it again"
                self.record(pod, "Warning", R.EVENT_BINDING_FAILED, message)
                return message
            loop = asyncio.get_running_loop()
            wait_s = max(min(self.settings.bind_wait_s, deadline - loop.time() - _BIND_AFTER_LOCK_S), 0.0)
            try:
                waited = await self.locker.acquire(args.node, args.pod_namespace, args.pod_name, wait_s)
            except (LockContention, KubeError) as exc:
                self.bind_backoff.note(args.node, ok=False)
                self.record(pod, "Warning", R.EVENT_BINDING_FAILED, str(exc))
                return str(exc)
            self.metrics.node_lock_wait_seconds.observe(waited)
        try:
            await self.kube.patch_pod_metadata(
                args.pod_namespace,
                args.pod_name,
                annotations={ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING, ann.BIND_TIME: str(int(time.time()))},
                uid=args.pod_uid,
                timeout=self._call_timeout(deadline, _BIND_UNDO_S),
            )
            await self.kube.bind_pod(
                args.pod_namespace,
                args.pod_name,
                args.pod_uid,
                args.node,
                timeout=self._call_timeout(deadline, _BIND_UNDO_S),
            )
        except KubeError as exc:
            # A Binding that timed out may have landed; a 409 may be a retry of one that did.
            if (outcome_unknown(exc) or isinstance(exc, Conflict)) and await self._bound_to(args, deadline):
                log.info("bind_ok_already_bound", pod=key, node=args.node, error=str(exc))
            else:
                await self._undo_bind(args, needs_lock, exc, deadline)
                self.bind_backoff.note(args.node, ok=False)
                self.record(pod, "Warning", R.EVENT_BINDING_FAILED, str(exc))
                log.warning("bind_failed", pod=key, node=args.node, error=str(exc))
                return f"binding pod {key} to {args.node} failed: {exc}"
        self.bind_backoff.note(args.node, ok=True)
        self.record(
            pod, "Normal", R.EVENT_BINDING_SUCCEED, f"Successfully binding node [{args.node}] to {key}"
        )
        log.info("bind_ok", pod=key, node=args.node)
        return ""

    async def _bound_to(self, args: BindArgs, deadline: float) -> bool:
        """Whether the pod is bound to ``args.node`` (after a Binding whose outcome is unknown)."""
        try:
            pod = await self.kube.get_pod(
                args.pod_namespace, args.pod_name, timeout=self._call_timeout(deadline)
            )
        except KubeError as exc:
            log.warning(
                "bind_outcome_unreadable", pod=f"{args.pod_namespace}/{args.pod_name}", error=str(exc)
            )
            return False
        return pod_uid(pod) == args.pod_uid and (pod.get("spec") or {}).get("nodeName") == args.node

    async def _undo_bind(self, args: BindArgs, needs_lock: bool, exc: KubeError, deadline: float) -> None:
        """A failed bind leaves nothing behind: lock released, ``bind-phase``/``bind-time`` removed."""
        if needs_lock:
            await self.locker.release(args.node, args.pod_namespace, args.pod_name, deadline=deadline)
        if isinstance(exc, NotFound):
            self.state.release(args.pod_uid)
            return
        try:
            await self.kube.patch_pod_metadata(
                args.pod_namespace,
                args.pod_name,
                annotations={ann.BIND_PHASE: None, ann.BIND_TIME: None},
                uid=args.pod_uid,
                timeout=self._call_timeout(deadline),
            )
        except KubeError as undo_exc:
            log.warning(
                "bind_phase_cleanup_failed",
                pod=f"{args.pod_namespace}/{args.pod_name}",
                error=str(undo_exc),
            )

    def _needs_lock(self, pod: JSON) -> bool:
        """HAMi takes the node lock only when a regular container requests the GPU count."""
        try:
            requests = PodFitSpec.from_pod(
                pod, self.config, self.settings.gpu_policy, self.settings.node_policy
            )
        except InvalidInput:
            return True
        n_init = init_container_count(pod)
        return any(r is not None and r.nums > 0 for r in requests.requests[n_init:])

    # -- admission --------------------------------------------------------------------------------

    def admit(self, pod: JSON, namespace: str) -> Verdict:
        """The webhook verdict for a pod (quota precheck against the live state)."""
        return review_pod(pod, self.config, self.settings.scheduler_name, self.state.fit_quota, namespace)

    def scheduler_owned_removed(self, pod: JSON, keys: tuple[str, ...]) -> None:
        """Count and log the scheduler-owned keys the webhook removed from a pod being created."""
        self.metrics.untrusted_annotations.labels("webhook").inc()
        meta = pod.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name') or meta.get('generateName', '')}"
        log.warning("scheduler_owned_annotations_removed", pod=name, keys=list(keys))


@dataclass(slots=True)
class NumaFit:
    """One filter's NUMA context: the pod, its memo shape and mode, and each node's prediction."""

    pod: JSON
    uid: str
    shape: Hashable
    mode: AlignmentMode
    predictions: dict[str, Prediction | None] = dataclass_field(default_factory=dict)

    @classmethod
    def of(cls, pod: JSON, uid: str) -> NumaFit:
        """The context of ``pod`` (its alignment mode was validated at admission; invalid: none)."""
        try:
            mode = parse_alignment((pod.get("metadata") or {}).get("annotations"))
        except InvalidInput:
            mode = AlignmentMode.NONE
        return cls(pod, uid, pod_shape(pod), mode)

    def predict(self, ledgers: NumaLedgers, node: str) -> Prediction | None:
        """The prediction on ``node`` (None: no ledger), kept for the patch and the log."""
        try:
            prediction = ledgers.predict(node, self.pod, self.shape, self.uid)
        except InvalidInput as exc:  # a pod the predictor cannot read keeps today's behaviour
            log.info("numa_predict_refused", node=node, error=str(exc))
            prediction = None
        self.predictions[node] = prediction
        return prediction


def _describe(prediction: Prediction | None) -> str:
    """The prediction for the filter's log line: ``placed numa=0,1``, ``unknown: reason``, ``none``."""
    if prediction is None:
        return "none"
    if prediction.outcome is Outcome.PLACED:
        numas = sorted({n for c in prediction.containers for n in c.numa})
        return f"placed numa={','.join(map(str, numas)) or '-'}"
    return f"{prediction.outcome}: {prediction.reason}"


@dataclass(frozen=True, slots=True)
class _Candidates:
    """A candidate list with its positions and unregistered names, for one node membership."""

    names: tuple[str, ...]
    membership: int
    position: Mapping[str, int]
    unregistered: tuple[str, ...]


def _filter_refusal(pod: JSON, cached: JSON | None) -> str:
    """Why the filter must not plan ``pod`` ("" when it may): unnamed, or already bound or started.

    ``cached`` is the scheduler's cached pod of the same name: when it is the same pod (UID) its
    ``spec.nodeName`` and phase are newer than the extender arguments' copy. A bound or running
    pod's GPUs are in use; re-planning it would rewrite its annotations under a running container.
    """
    meta = pod["metadata"]
    for field in ("uid", "name", "namespace"):
        if not isinstance(meta.get(field), str) or not meta[field]:
            return f"extender args pod has no metadata.{field}"
    for copy in (pod, cached):
        if copy is None or pod_uid(copy) != meta["uid"]:
            continue
        spec, status = copy.get("spec"), copy.get("status")
        bound = spec.get("nodeName") if isinstance(spec, dict) else None
        phase = status.get("phase") if isinstance(status, dict) else None
        if bound or phase not in (None, "Pending"):
            where = f"bound to {bound}" if bound else f"{phase}"
            return f"pod {pod_key(pod)} is already {where}: it is not filtered again"
    return ""


def _chosen(result: FilterResult) -> bool:
    return bool(result.node_names) or bool(result.nodes)


def _triage(
    group: Iterable[str],
    nodes: Mapping[str, NodeEntry],
    now: float,
    backing_off: Mapping[str, float],
    own_node: str | None,
    need: tuple[int, int, int],
    failed: dict[str, str],
    passed: list[NodeEntry],
) -> list[NodeEntry]:
    """The nodes of one score group worth a fit now, in order.

    An unhealthy node gets its reason in ``failed``; a node backing off is left for last (by the
    caller); a node whose room is below ``need`` (GPUs, MiB, cores) goes to ``passed``, fitted only
    when no other node fits. The pod's own node is always tried: its booking is free to it.
    """
    need_gpus, need_mem, need_cores = need
    tries: list[NodeEntry] = []
    for name in group:
        entry = nodes[name]
        if not entry.healthy(now):
            failed[name] = R.NODE_UNREGISTERED
            continue
        if name in backing_off:
            continue
        if name != own_node:
            gpus, mem, cores = entry.usage.room()
            if gpus < need_gpus or mem < need_mem or cores < need_cores:
                passed.append(entry)
                continue
        tries.append(entry)
    return tries

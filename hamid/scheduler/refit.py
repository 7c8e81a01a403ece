"""``POST /refit``: move one container's pending GPU reservation onto GPUs kubelet allows (NUMA refit).

Wire-compatible with HAMi's ``RefitNumaAllocation`` (numa-refit-upstream §2-§4): refusals are
in-band (HTTP 200, ``succeeded: false``; malformed JSON too), a missing body answers 400. The
algorithm re-runs the normal fit restricted to the allowed GPUs with the reservation's amounts
(every policy kept, phase-aware capacity, quota on the positional layout), then commits with ONE
merge patch of both allocation annotations (only the target container's entry changes, every other
byte is kept) guarded by the pod's resourceVersion. One 2 s deadline from the request's arrival
covers authentication, the cache wait, the node's lock and the patch.

Better than upstream: the lock is the scheduler's *per-node* lock, and the reservation is moved
tentatively before the patch is awaited (rolled back on failure), so a slow API server delays only
refits of that node and filters never see a stale plan; a pod deleted meanwhile is neither
released twice nor resurrected (#3027).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from hamid.fit.fit import PodFitSpec, Unfit, fit_container_restricted, is_heterogeneous, pod_quota_usage
from hamid.kube.cache import version_number
from hamid.kube.errors import Conflict, KubeError, NotFound, outcome_unknown
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MODE_MIG, NVIDIA, ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.refit import (
    RefitRequest,
    RefitResponse,
)
from hamid.model.resources import all_containers
from hamid.scheduler.core import Scheduler
from hamid.scheduler.http import RouteRegistrar
from hamid.scheduler.refit_auth import AuthError, RefitAuthenticator
from hamid.scheduler.state import JSON, Reservation

if TYPE_CHECKING:
    from hamid.scheduler.cli import SchedulerOptions

log = get_logger("scheduler.refit")

#: Upstream's ``refitPatchTimeout``: no longer than the device plugin's own refit budget.
PATCH_TIMEOUT_S = 2.0
#: How long a refit waits for the scheduler's caches to finish their first list.
SYNC_WAIT_S = 2.0
#: One deadline over a whole refit, from the request's arrival: authentication, cache wait, the
#: node's lock and the patch all fit in it (the plugin gives up after its own 2 s); past it the
#: refit is refused with nothing changed.
REFIT_DEADLINE_S = 2.0
#: Bound of the GET that learns whether a patch with an ambiguous outcome (timeout, 5xx) landed,
#: and of the GET refreshing a cached pod older than the reservation.
POD_READ_TIMEOUT_S = 2.0
MSG_NO_BODY = "Please send a request body"
#: Upstream's answer when its caches never synced before the request's context ended; hamid's
#: refusal starts with it (users grep for it) and goes on to say what is not ready.
MSG_NOT_SYNCED = "context cancelled"
_REFIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


def _q(text: str) -> str:
    """Go's ``%q`` for the strings in refusal messages."""
    return json.dumps(text)


def _uuids(devices: ContainerDevices) -> str:
    """Go's ``%v`` of a string slice: ``[a b]``."""
    return "[" + " ".join(d.uuid for d in devices) + "]"


class Refusal(Exception):
    """A refused refit: ``code`` labels the metric, ``identified`` says whether to record an Event."""

    def __init__(self, code: str, message: str, *, identified: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.identified = identified


class RefitMetrics:
    """``hamid_refit_total{outcome,reason}`` and ``hamid_refit_duration_seconds{outcome}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "hamid_refit_total",
            "NUMA refit requests by outcome (moved, noop, refused) and refusal reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        self.seconds = Histogram(
            "hamid_refit_duration_seconds",
            "Time to answer /refit, by outcome.",
            ["outcome"],
            buckets=_REFIT_BUCKETS,
            registry=registry,
        )

    @classmethod
    def of(cls, registry: CollectorRegistry) -> RefitMetrics:
        """The refit metrics registered in ``registry`` (created once per registry)."""
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = _METRICS[registry] = cls(registry)
        return metrics

    def observe(self, outcome: str, reason: str, seconds: float) -> None:
        """Count one answered refit."""
        self.total.labels(outcome, reason).inc()
        self.seconds.labels(outcome).observe(seconds)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, RefitMetrics] = weakref.WeakKeyDictionary()


def splice_entry(raw: str, index: int, entry: str, what: str) -> str:
    """``raw`` with container ``index``'s entry (``;``-separated) replaced; every other byte kept.

    Raises :class:`InvalidInput` (``cannot rewrite <what> annotation: …``) when the value has no
    non-empty entry at ``index``.
    """
    pieces = raw.split(";")
    if not 0 <= index < len(pieces) or not pieces[index]:
        raise InvalidInput(f"cannot rewrite {what} annotation: container {index} has no entry in {raw!r}")
    pieces[index] = entry
    return ";".join(pieces)


@dataclass(frozen=True, slots=True)
class _Outcome:
    response: RefitResponse
    outcome: str
    reason: str


class RefitService:
    """The ``/refit`` handler over one :class:`~hamid.scheduler.core.Scheduler`."""

    def __init__(
        self,
        scheduler: Scheduler,
        authenticator: RefitAuthenticator,
        *,
        patch_timeout: float = PATCH_TIMEOUT_S,
        sync_wait: float = SYNC_WAIT_S,
        deadline: float = REFIT_DEADLINE_S,
        metrics: RefitMetrics | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.auth = authenticator
        self.patch_timeout = patch_timeout
        self.sync_wait = sync_wait
        self.deadline = deadline
        self.metrics = metrics or RefitMetrics.of(scheduler.metrics.registry)

    def register(self, app: web.Application) -> None:
        """Add ``POST /refit`` to ``app`` (a :data:`~hamid.scheduler.http.RouteRegistrar`)."""
        app.router.add_post("/refit", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        """HTTP as upstream: 400 without a body, 413 above 1 MiB, otherwise 200 with the response.

        A body that is not JSON, or carries fields of the wrong type, is a refusal with the
        decode error as ``failureReason`` (upstream ``TestNumaRefitRoute_DecodeError``).
        """
        deadline = asyncio.get_running_loop().time() + self.deadline
        started = time.perf_counter()
        body = await request.read()  # the app's client_max_size (1 MiB) answers 413 above it
        if not body:
            return web.Response(status=400, text=MSG_NO_BODY)
        try:
            refit = RefitRequest.from_json(json.loads(body))
        except InvalidInput as exc:  # a field of the wrong type, or upstream's stateless checks
            return self._refuse_request("invalid_request", str(exc), started)
        except (ValueError, UnicodeDecodeError) as exc:  # not JSON at all
            return self._refuse_request("decode_error", f"cannot decode refit request: {exc}", started)
        result = await self.refit(refit, request, deadline)
        self.metrics.observe(result.outcome, result.reason, time.perf_counter() - started)
        return web.json_response(result.response.to_json())

    def _late(self, stage: str) -> Refusal:
        """The refusal of a refit whose deadline passed before ``stage``; nothing was changed."""
        return Refusal(
            "deadline", f"refit deadline of {self.deadline:g}s passed before {stage}; nothing changed"
        )

    def _refuse_request(self, code: str, reason: str, started: float) -> web.Response:
        """The in-band refusal of a request that could not be read as a valid refit request."""
        log.info("NUMA refit refused", reason=reason, code=code)
        self.metrics.observe("refused", code, time.perf_counter() - started)
        return web.json_response(RefitResponse.failure(reason).to_json())

    async def refit(self, refit: RefitRequest, request: web.Request, deadline: float) -> _Outcome:
        """Authenticate, then refit under the node's lock, all before ``deadline`` (loop time).

        Every refusal is logged; past the deadline nothing is changed.
        """
        pod_ref = f"{refit.pod_namespace}/{refit.pod_name}"
        with structlog.contextvars.bound_contextvars(
            pod=pod_ref, node=refit.node_name, container=refit.container_index
        ):
            try:
                try:
                    async with asyncio.timeout_at(deadline):
                        caller = await self.auth.authenticate(request, refit.node_name)
                except AuthError as exc:
                    log.info("refit caller refused", auth_failure=str(exc.kind))
                    raise Refusal("unauthenticated", f"caller authentication failed: {exc}") from None
                except TimeoutError:
                    raise self._late("caller authentication") from None
                await self._ready(deadline)
                lock = self.scheduler.state.node_lock(refit.node_name)
                try:
                    async with asyncio.timeout_at(deadline):
                        await lock.acquire()
                except TimeoutError:
                    raise self._late(f"node {refit.node_name} was free for a refit") from None
                try:
                    response, outcome = await self._refit_locked(refit, deadline)
                finally:
                    lock.release()
            except Refusal as refusal:
                log.info("NUMA refit refused", reason=refusal.message, code=refusal.code)
                if refusal.identified:
                    self._record_failure(refit, refusal.message)
                return _Outcome(RefitResponse.failure(refusal.message), "refused", refusal.code)
            log.debug("refit caller", caller=caller.identity, method=caller.method)
            return _Outcome(response, outcome, "")

    async def _ready(self, deadline: float) -> None:
        scheduler = self.scheduler
        if not scheduler.synced:
            wait_until = min(deadline, asyncio.get_running_loop().time() + self.sync_wait)
            try:
                async with asyncio.timeout_at(wait_until):
                    await scheduler.pods.wait_synced()
                    await scheduler.nodes.wait_synced()
                    await scheduler.quotas.wait_synced()
            except TimeoutError:
                raise Refusal(
                    "not_ready", f"{MSG_NOT_SYNCED}: scheduler not ready: caches not synced"
                ) from None
        reason = scheduler.not_ready_reason()
        if reason:
            raise Refusal("not_ready", f"{MSG_NOT_SYNCED}: scheduler not ready: {reason}")

    def _record_failure(self, refit: RefitRequest, message: str) -> None:
        pod = self.scheduler.pods.get(f"{refit.pod_namespace}/{refit.pod_name}")
        if pod is not None:
            self.scheduler.record(pod, "Warning", R.EVENT_NUMA_REFIT_FAILED, message)

    def _identify(self, refit: RefitRequest) -> tuple[JSON, Reservation]:
        """The tracked pod and its reservation (upstream §3 step 3)."""
        state = self.scheduler.state
        res = state.reservation(refit.pod_uid)
        if res is None:
            raise Refusal("unknown_pod", f"pod {refit.pod_uid} is not tracked by the scheduler")
        if (res.namespace, res.name) != (refit.pod_namespace, refit.pod_name):
            raise Refusal(
                "identity_mismatch",
                f"pod {refit.pod_uid} does not match {refit.pod_namespace}/{refit.pod_name}",
            )
        pod = self.scheduler.pods.get(res.key)
        if pod is None or str((pod.get("metadata") or {}).get("uid") or "") != refit.pod_uid:
            raise Refusal("unknown_pod", f"pod {refit.pod_uid} is not tracked by the scheduler")
        if res.node != refit.node_name:
            raise Refusal(
                "wrong_node",
                f"pod {res.key} is tracked on node {res.node}, not {refit.node_name}",
                identified=True,
            )
        if res.pending:
            raise Refusal(
                "not_pending", f"pod {res.key}: its allocation is still being written", identified=True
            )
        return pod, res

    async def _fresh_pod(self, pod: JSON, res: Reservation, deadline: float) -> JSON:
        """``pod`` (cached), or the API server's copy when the cache lags behind the reservation.

        After a refit of another container the reservation is derived from the patch's answer
        while the cache may not have the event yet: splicing its stale annotations would be
        refused with a 409 (or, without a precondition, undo the first refit).
        """
        cached = version_number(str((pod.get("metadata") or {}).get("resourceVersion") or ""))
        wanted = version_number(res.version)
        if cached is None or wanted is None or cached >= wanted:
            return pod
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise self._late("reading the pod")
        try:
            fresh = await self.scheduler.kube.get_pod(
                res.namespace, res.name, timeout=min(POD_READ_TIMEOUT_S, remaining)
            )
        except KubeError as exc:
            raise Refusal("pod_unreadable", f"cannot read pod {res.key}: {exc}", identified=True) from None
        if str((fresh.get("metadata") or {}).get("uid") or "") != res.uid:
            raise Refusal("unknown_pod", f"pod {res.uid} is not tracked by the scheduler")
        return fresh

    async def _refit_locked(self, refit: RefitRequest, deadline: float) -> tuple[RefitResponse, str]:
        """Steps 3-15 of upstream's algorithm; the caller holds the node's lock."""
        state = self.scheduler.state
        pod, res = self._identify(refit)
        pod = await self._fresh_pod(pod, res, deadline)
        index = refit.container_index

        def refuse(code: str, message: str) -> Refusal:
            return Refusal(code, message, identified=True)

        containers = all_containers(pod)
        if not 0 <= index < len(containers):
            raise refuse("bad_container", f"container index {index} is outside the pod's containers")
        actual_name = str(containers[index].get("name") or "")
        if refit.container_name and refit.container_name != actual_name:
            raise refuse(
                "bad_container",
                f"container index {index} is {_q(actual_name)}, not {_q(refit.container_name)}",
            )
        annotations: dict[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
        if annotations.get(ann.MIG_ALLOCATIONS):
            raise refuse("mig", "the pod holds MIG allocations; the NUMA refit does not support MIG")
        pending_raw = annotations.get(ann.DEVICES_TO_ALLOCATE) or ""
        allocated_raw = annotations.get(ann.DEVICES_ALLOCATED) or ""
        try:
            pending = ann.decode_pod_devices(pending_raw, ann.DEVICES_TO_ALLOCATE) if pending_raw else ()
        except InvalidInput as exc:
            raise refuse("bad_annotation", f"cannot decode pending allocation annotation: {exc}") from None
        try:
            layout = ann.decode_pod_devices(allocated_raw, ann.DEVICES_ALLOCATED) if allocated_raw else ()
        except InvalidInput as exc:
            raise refuse("bad_annotation", f"cannot decode allocated annotation: {exc}") from None
        if index >= len(pending) or not pending[index]:
            raise refuse("not_pending", f"container {index} has no pending {NVIDIA} allocation to refit")
        current = layout[index] if index < len(layout) else ()
        if not current:
            raise refuse("not_pending", f"container {index} has no recorded {NVIDIA} allocation")
        foreign = sorted({d.type for d in current if d.type != NVIDIA})
        if foreign:
            raise refuse(
                "non_nvidia",
                f"container {index} reserves {', '.join(foreign)} devices; "
                f"the NUMA refit supports only {NVIDIA}",
            )
        allowed = frozenset(refit.allowed_device_uuids)
        if all(d.uuid in allowed for d in current):
            log.info("NUMA refit not needed: already on allowed GPUs", devices=[d.uuid for d in current])
            return RefitResponse.success(current), "noop"
        if is_heterogeneous(current):
            raise refuse(
                "heterogeneous",
                f"container {index} reserves differing amounts per device; "
                "the refit does not support heterogeneous reservations",
            )
        entry = state.nodes.get(res.node)
        if entry is None:
            raise refuse("node_unavailable", f"node {res.node} unavailable: not registered")
        for uuid in [d.uuid for d in current] + list(refit.allowed_device_uuids):
            device = entry.usage.by_id.get(uuid)
            if device is not None and device.mode == MODE_MIG:
                what = "reserved" if uuid not in allowed else "allowed"
                raise refuse(
                    "mig", f"{what} device {uuid} is in MIG mode; the NUMA refit does not support MIG"
                )
        settings = self.scheduler.settings
        try:
            spec = PodFitSpec.from_pod(pod, self.scheduler.config, settings.gpu_policy, settings.node_policy)
        except InvalidInput as exc:
            raise refuse("bad_annotation", f"invalid pod scheduling annotations: {exc}") from None
        quota = state.fit_quota(res.namespace, exclude_uid=res.uid)
        result = fit_container_restricted(
            entry.usage,
            layout,
            res.kinds,
            index,
            allowed,
            spec.policy,
            init_released=res.init_released,
            quota=quota,
            booked=res.applied,
        )
        if isinstance(result, Unfit):
            pinned = spec.policy.use_uuids
            if pinned is not None and not pinned & allowed:
                # upstream's wording (the fit's CardUuidMismatch), then which pin excluded them
                raise refuse(
                    "pinned",
                    f"no allowed device fits: {result.reason} (container {index} is pinned by "
                    f"{ann.USE_GPU_UUID} to [{' '.join(sorted(pinned))}], "
                    "none of which is in the allowed set)",
                )
            raise refuse("no_fit", f"no allowed device fits: {result.reason}")
        if quota is not None and quota.limited:
            mem, cores = pod_quota_usage(result.layout, res.kinds, res.init_released)
            if not quota.fits(mem, cores):
                config = self.scheduler.config
                over_mem = quota.mem_limit is not None and quota.used_mem + mem > quota.mem_limit
                resource = config.resource_memory_name if over_mem else config.resource_core_name
                raise refuse(
                    "quota", f"refit would exceed the {resource} resource quota in namespace {res.namespace}"
                )
        encoded = ann.encode_container_devices(result.devices)
        try:
            new_pending = splice_entry(pending_raw, index, encoded, "pending allocation")
            new_allocated = splice_entry(allocated_raw, index, encoded, "allocated")
        except InvalidInput as exc:
            raise refuse("bad_annotation", str(exc)) from None
        patched = await self._commit(pod, res.uid, result.layout, new_pending, new_allocated, deadline)
        if state.reservation(res.uid) is None:
            log.info("pod left the scheduler cache during NUMA refit; annotations remain authoritative")
        else:
            state.on_pod(patched)
        message = f"NUMA refit moved container {index} from {_uuids(current)} to {_uuids(result.devices)}"
        log.info("NUMA refit succeeded", moved_from=_uuids(current), moved_to=_uuids(result.devices))
        self.scheduler.record(pod, "Normal", R.EVENT_NUMA_REFIT_SUCCEED, message)
        return RefitResponse.success(result.devices), "moved"

    async def _commit(
        self,
        pod: JSON,
        uid: str,
        layout: PodDevices,
        new_pending: str,
        new_allocated: str,
        deadline: float,
    ) -> JSON:
        """Move the reservation tentatively, then ONE resourceVersion-guarded patch.

        Until the patch is decided the pod books BOTH its old and its new GPUs (a state hold):
        a filter running meanwhile can take neither, so a rollback never over-commits the old
        GPUs; likewise its namespace quota counts the larger of its old and new usage. A
        definite refusal (409, 404, other 4xx) rolls back at once. An ambiguous failure
        (timeout, no answer, 5xx) may have been applied: one bounded GET decides, and when it
        cannot, the pod's next event does (see :meth:`SchedulerState.settle_on_event`) — the
        accounting follows what the API server holds. Either failure is a :class:`Refusal`.
        """
        meta = pod.get("metadata") or {}
        precondition = str(meta.get("resourceVersion") or "")
        state = self.scheduler.state
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise self._late("patching the pod")
        res = state.reservation(uid)
        if res is None:
            raise Refusal("unknown_pod", f"pod {uid} is not tracked by the scheduler", identified=True)
        if res.blocked is None:
            old_mem, old_cores = pod_quota_usage(res.layout, res.kinds, res.init_released)
            new_mem, new_cores = pod_quota_usage(layout, res.kinds, res.init_released)
            mem, cores = max(old_mem - new_mem, 0), max(old_cores - new_cores, 0)
        else:
            mem = cores = 0
        hold = state.hold(uid, res.node, res.applied, res.namespace, mem, cores)
        undo = state.move(uid, layout, new_allocated)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        timeout = min(self.patch_timeout, remaining)
        try:
            async with asyncio.timeout(timeout):
                patched = await self.scheduler.kube.patch_pod_metadata(
                    namespace,
                    name,
                    annotations={ann.DEVICES_TO_ALLOCATE: new_pending, ann.DEVICES_ALLOCATED: new_allocated},
                    resource_version=precondition,
                    timeout=timeout,
                )
        except (KubeError, TimeoutError) as exc:
            detail = str(exc) or f"no answer within {timeout:g}s"
            if not outcome_unknown(exc):
                undo()
                state.release_hold(hold)
                code = (
                    "patch_conflict"
                    if isinstance(exc, Conflict)
                    else "pod_gone"
                    if isinstance(exc, NotFound)
                    else "patch_failed"
                )
                raise Refusal(code, f"cannot patch pod annotations: {detail}", identified=True) from None
            outcome = await self._decide(namespace, name, uid, precondition, new_allocated)
            if outcome is None:
                state.settle_on_event(hold, precondition)
                log.warning("refit_patch_outcome_unknown", held=sorted(hold.amounts))
                what = "its outcome is unknown; both GPU sets stay booked until the pod's next update"
            else:
                if not outcome:
                    undo()
                state.release_hold(hold)
                what = "it was applied" if outcome else "it was not applied"
            raise Refusal(
                "patch_timeout", f"cannot patch pod annotations: {detail} ({what})", identified=True
            ) from None
        except BaseException:
            undo()
            state.release_hold(hold)
            raise
        state.release_hold(hold)
        return patched

    async def _decide(
        self, namespace: str, name: str, uid: str, precondition: str, new_allocated: str
    ) -> bool | None:
        """Whether an ambiguous patch landed, from one bounded GET (None: the GET failed too)."""
        try:
            current = await self.scheduler.kube.get_pod(namespace, name, timeout=POD_READ_TIMEOUT_S)
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("refit_patch_outcome_unreadable", error=str(exc))
            return None
        meta = current.get("metadata") or {}
        if str(meta.get("uid") or "") != uid:
            return False
        if str(meta.get("resourceVersion") or "") == precondition:
            return False
        return (meta.get("annotations") or {}).get(ann.DEVICES_ALLOCATED) == new_allocated


def refit_routes(
    scheduler: Scheduler,
    authenticator: RefitAuthenticator,
    *,
    patch_timeout: float = PATCH_TIMEOUT_S,
    sync_wait: float = SYNC_WAIT_S,
    deadline: float = REFIT_DEADLINE_S,
) -> RouteRegistrar:
    """A registrar adding ``POST /refit`` to the cluster app (``cluster_app(..., extra_routes=[...])``)."""
    service = RefitService(
        scheduler, authenticator, patch_timeout=patch_timeout, sync_wait=sync_wait, deadline=deadline
    )
    return service.register


def authenticator_from_options(scheduler: Scheduler, options: SchedulerOptions) -> RefitAuthenticator:
    """The caller authenticator the ``hamid scheduler`` flags describe (``--refit-auth`` & co)."""
    return RefitAuthenticator(
        options.refit_auth,
        kube=scheduler.kube,
        verifies_client_certs=bool(options.client_ca_file and options.tls_cert_file and options.tls_key_file),
        device_plugin_namespace=options.device_plugin_namespace,
        device_plugin_service_account=options.device_plugin_service_account,
        token_audience=options.refit_token_audience,
        hami_plugin_service_account=options.refit_hami_plugin_service_account,
    )


def refit_route_factory(scheduler: Scheduler, options: SchedulerOptions) -> RouteRegistrar:
    """``run_scheduler(options, extra_routes=[refit_route_factory])``: ``POST /refit`` per the flags."""
    return refit_routes(scheduler, authenticator_from_options(scheduler, options))

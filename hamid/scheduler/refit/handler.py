"""The ``POST /refit`` handler: body limits, one deadline, caller authentication, metrics.

It gathers the facts under the node's guard, asks :func:`~hamid.scheduler.refit.plan.plan_refit`
for the decision and hands a plan to :class:`~hamid.scheduler.refit.commit.RefitCommitter`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from hamid.kube.cache import PodCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.errors import InvalidInput
from hamid.model.kube import Pod, PodBody
from hamid.model.refit import REFIT_TIMEOUT_S, RefitRequest, RefitResponse
from hamid.model.resources import ResourceConfig
from hamid.scheduler.http import RouteRegistrar, parse_json_body, read_body
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.outbox import EventOutbox, Record, Tasks
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.refit.auth import Authenticator, AuthError
from hamid.scheduler.refit.commit import PATCH_TIMEOUT_S, POD_READ_TIMEOUT_S, RefitCommitter
from hamid.scheduler.refit.plan import (
    MSG_NOT_SYNCED,
    Booking,
    NoOp,
    RefitFacts,
    RefitPlan,
    RefusalCode,
    RefusalError,
    Refused,
    identify,
    plan_refit,
    uuid_list,
)
from hamid.scheduler.settings import SchedulerSettings

log = get_logger("scheduler.refit")

#: How long a refit waits for the scheduler's caches to finish their first list (at most its budget).
SYNC_WAIT_S = REFIT_TIMEOUT_S
MSG_NO_BODY = "Please send a request body"
_REFIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class RefitMetrics:
    """``hamid_refit_total{outcome,reason}`` and ``hamid_refit_duration_seconds{outcome}``.

    ``reason`` is a :class:`RefusalCode` value ("" for moved/noop).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "hamid_refit_total",
            "NUMA refit requests by outcome (moved, noop, refused) and refusal reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        for code in RefusalCode:  # at 0 from the start: an alert's increase() sees the first refusal
            self.total.labels("refused", code.value)
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

    def observe(self, outcome: str, reason: RefusalCode | None, seconds: float) -> None:
        """Count one answered refit."""
        self.total.labels(outcome, "" if reason is None else reason.value).inc()
        self.seconds.labels(outcome).observe(seconds)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, RefitMetrics] = weakref.WeakKeyDictionary()


class RefitHost(Protocol):
    """What a refit needs of its scheduler (:class:`~hamid.scheduler.core.Scheduler` is one)."""

    @property
    def ledger(self) -> Ledger: ...

    @property
    def numa(self) -> NumaLedgers: ...

    @property
    def kube(self) -> KubeClient: ...

    @property
    def pods(self) -> PodCache: ...

    @property
    def readiness(self) -> Readiness: ...

    @property
    def metrics(self) -> SchedulerMetrics: ...

    @property
    def config(self) -> ResourceConfig: ...

    @property
    def settings(self) -> SchedulerSettings: ...

    @property
    def tasks(self) -> Tasks: ...

    @property
    def outbox(self) -> EventOutbox: ...

    async def wait_synced(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Outcome:
    response: RefitResponse
    outcome: str
    reason: RefusalCode | None = None


class RefitService:
    """The ``/refit`` handler over one scheduler's parts (:class:`RefitHost`)."""

    def __init__(
        self,
        host: RefitHost,
        authenticator: Authenticator,
        *,
        patch_timeout: float = PATCH_TIMEOUT_S,
        sync_wait: float = SYNC_WAIT_S,
        deadline: float = REFIT_TIMEOUT_S,
        metrics: RefitMetrics | None = None,
    ) -> None:
        self.ledger = host.ledger
        self.kube = host.kube
        self.pods = host.pods
        self.readiness = host.readiness
        self.config = host.config
        self.settings = host.settings
        self.record: Record = host.outbox.record
        self.wait_synced = host.wait_synced
        self.auth = authenticator
        self.committer = RefitCommitter(
            host.ledger, host.numa, host.kube, host.readiness, host.tasks.spawn, patch_timeout
        )
        self.sync_wait = sync_wait
        self.deadline = deadline
        self.metrics = metrics or RefitMetrics.of(host.metrics.registry)

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
        body = await read_body(request)  # 413 above the app's client_max_size (1 MiB), 400 undecodable
        if not body:
            return web.Response(status=400, text=MSG_NO_BODY)
        try:  # not JSON at all, not UTF-8, or nested too deep
            document = parse_json_body(body)
        except InvalidInput as exc:
            message = f"cannot decode refit request: {exc}"
            return self._refuse_request(RefusalCode.DECODE_ERROR, message, started)
        try:
            refit = RefitRequest.from_json(document)
        except InvalidInput as exc:  # a field of the wrong type, or upstream's stateless checks
            return self._refuse_request(RefusalCode.INVALID_REQUEST, str(exc), started)
        result = await self.refit(refit, request, deadline)
        self.metrics.observe(result.outcome, result.reason, time.perf_counter() - started)
        return web.json_response(result.response.to_json())

    def _late(self, stage: str) -> RefusalError:
        """The refusal of a refit whose deadline passed before ``stage``; nothing was changed."""
        message = f"refit deadline of {self.deadline:g}s passed before {stage}; nothing changed"
        return RefusalError(RefusalCode.DEADLINE, message, identified=False)

    def _refuse_request(self, code: RefusalCode, reason: str, started: float) -> web.Response:
        """The in-band refusal of a request that could not be read as a valid refit request."""
        log.info("numa_refit_refused", reason=reason, code=code.value)
        self.metrics.observe("refused", code, time.perf_counter() - started)
        return web.json_response(RefitResponse.failure(reason).to_json())

    async def refit(self, refit: RefitRequest, request: web.Request, deadline: float) -> _Outcome:
        """Authenticate, then refit under the node's guard, all before ``deadline`` (loop time).

        Every refusal is logged; past the deadline nothing is changed.
        """
        pod_ref = f"{refit.pod_namespace}/{refit.pod_name}"
        with structlog.contextvars.bound_contextvars(
            pod=pod_ref, node=refit.node_name, container=refit.container_index
        ):
            try:
                await self._authenticate(refit, request, deadline)
                epoch = await self._ready(deadline)
                lock = self.ledger.node_guard(refit.node_name)
                try:
                    async with asyncio.timeout_at(deadline):
                        await lock.acquire()
                except TimeoutError:
                    raise self._late(f"node {refit.node_name} was free for a refit") from None
                try:
                    return await self._refit_locked(refit, deadline, epoch)
                finally:
                    lock.release()
            except RefusalError as err:
                refused = err.refused
                log.info("numa_refit_refused", reason=refused.message, code=refused.code.value)
                if refused.identified:
                    self._record_failure(refit, refused.message)
                return _Outcome(RefitResponse.failure(refused.message), "refused", refused.code)

    async def _authenticate(self, refit: RefitRequest, request: web.Request, deadline: float) -> None:
        """The caller must prove the request's node (see :mod:`hamid.scheduler.refit.auth`)."""
        try:
            async with asyncio.timeout_at(deadline):
                caller = await self.auth.authenticate(request, refit.node_name)
        except AuthError as exc:
            log.info("refit_caller_refused", auth_failure=str(exc.kind))
            message = f"caller authentication failed: {exc}"
            raise RefusalError(RefusalCode.UNAUTHENTICATED, message, identified=False) from None
        except TimeoutError:
            raise self._late("caller authentication") from None
        log.debug("refit_caller", caller=caller.identity, method=caller.method)

    async def _ready(self, deadline: float) -> str:
        """Refuse unless this replica decides; the leadership epoch the refit runs under."""
        if not self.readiness.synced:
            wait_until = min(deadline, asyncio.get_running_loop().time() + self.sync_wait)
            try:
                async with asyncio.timeout_at(wait_until):
                    await self.wait_synced()
            except TimeoutError:
                message = f"{MSG_NOT_SYNCED}: scheduler not ready: caches not synced"
                raise RefusalError(RefusalCode.NOT_READY, message, identified=False) from None
        reason = self.readiness.reason()
        if reason:
            message = f"{MSG_NOT_SYNCED}: scheduler not ready: {reason}"
            raise RefusalError(RefusalCode.NOT_READY, message, identified=False)
        return self.readiness.epoch()

    def _record_failure(self, refit: RefitRequest, message: str) -> None:
        pod = self.pods.get(f"{refit.pod_namespace}/{refit.pod_name}")
        if pod is not None:
            self.record(pod, "Warning", R.EVENT_NUMA_REFIT_FAILED, message)

    async def _fresh_pod(self, pod: Pod, booking: Booking, version: str, deadline: float) -> PodBody:
        """``pod`` (cached), or the API server's copy when the cache lags behind the reservation.

        After a refit of another container the reservation is derived from the patch's answer
        while the cache may not have the event yet: splicing its stale annotations would be
        refused with a 409 (or, without a precondition, undo the first refit).
        """
        if objects.version_at_least(objects.resource_version(pod), version) is not False:
            return pod
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise self._late("reading the pod")
        try:
            return await self.kube.get_pod(
                booking.namespace, booking.name, timeout=min(POD_READ_TIMEOUT_S, remaining)
            )
        except KubeError as exc:
            message = f"cannot read pod {booking.key}: {exc}"
            raise RefusalError(RefusalCode.POD_UNREADABLE, message) from None

    async def _refit_locked(self, refit: RefitRequest, deadline: float, epoch: str) -> _Outcome:
        """Gather the facts, decide, commit; the caller holds the node's guard."""
        ledger = self.ledger
        booking = ledger.reservation(refit.pod_uid)
        cached = self.pods.get(booking.key) if booking is not None else None
        refused = identify(refit, booking, cached)
        if refused is not None:
            raise RefusalError.of(refused)
        assert booking is not None and cached is not None
        pod = await self._fresh_pod(cached, booking, booking.version, deadline)
        entry = ledger.nodes.get(booking.node)
        facts = RefitFacts(
            request=refit,
            booking=booking,
            pod=pod,
            node=entry.usage if entry is not None else None,
            config=self.config,
            gpu_policy=self.settings.gpu_policy,
            node_policy=self.settings.node_policy,
            quota=ledger.fit_quota(booking.namespace, exclude_uid=booking.uid),
        )
        decision = plan_refit(facts)
        if isinstance(decision, Refused):
            raise RefusalError.of(decision)
        if isinstance(decision, NoOp):
            log.info("numa_refit_not_needed", devices=[d.uuid for d in decision.devices])
            return _Outcome(RefitResponse.success(decision.devices), "noop")
        return await self._commit(pod, booking.uid, decision, deadline, epoch)

    async def _commit(self, pod: PodBody, uid: str, plan: RefitPlan, deadline: float, epoch: str) -> _Outcome:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise self._late("patching the pod")
        patched = await self.committer.commit(pod, uid, plan, remaining, epoch)
        ledger = self.ledger
        if ledger.reservation(uid) is None:
            log.info("pod_left_cache_during_refit")
        else:
            ledger.on_pod(patched)
        moved_from, moved_to = uuid_list(plan.current), uuid_list(plan.devices)
        message = f"NUMA refit moved container {plan.index} from {moved_from} to {moved_to}"
        log.info("numa_refit_succeeded", moved_from=moved_from, moved_to=moved_to)
        self.record(pod, "Normal", R.EVENT_NUMA_REFIT_SUCCEED, message)
        return _Outcome(RefitResponse.success(plan.devices), "moved")


def refit_routes(
    host: RefitHost,
    authenticator: Authenticator,
    *,
    patch_timeout: float = PATCH_TIMEOUT_S,
    sync_wait: float = SYNC_WAIT_S,
    deadline: float = REFIT_TIMEOUT_S,
) -> RouteRegistrar:
    """A registrar adding ``POST /refit`` to the cluster app (``cluster_app(..., extra_routes=[...])``)."""
    service = RefitService(
        host, authenticator, patch_timeout=patch_timeout, sync_wait=sync_wait, deadline=deadline
    )
    return service.register

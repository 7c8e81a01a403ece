"""The composition root of ``hamid scheduler``: scheduler engine, listeners, leadership, TLS reloader.

The CLI, the simulator, the demo, the benchmarks and the test harnesses all start the scheduler
through :class:`SchedulerApp`, so they run the same start-up: the engine
(:class:`~hamid.scheduler.core.Scheduler`), the extender, cluster (webhook, probes, ``/refit``) and
metrics listeners, leader election when enabled, the certificate reloader. Each consumer is handed
the parts it uses (the verbs, the readiness, admission, the metrics, a :class:`RefitHost`), never
the engine itself.
Collaborators a caller may want to own are passed at construction (the API client, the event
recorder, the cluster app's extra routes such as ``/refit`` with its authenticator).

With ``leader_elect`` the replica follows the Lease of the kube-scheduler in its pod (mode
``follow``, HAMi's model) or campaigns for its own Lease (mode ``campaign``, when no
kube-scheduler runs beside it); terms and role labels are in :mod:`hamid.scheduler.ha`.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Sequence

from aiohttp import web

from hamid.kube.client import KubeClient, connect
from hamid.kube.events import EventRecorder
from hamid.kube.leader import LeaderElector, LeaseFollower
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.scheduler.core import Scheduler
from hamid.scheduler.ha import Leadership
from hamid.scheduler.http import RouteRegistrar, cluster_app, extender_app, metrics_app, serve
from hamid.scheduler.options import SchedulerOptions
from hamid.scheduler.refit import RefitHost, refit_routes
from hamid.scheduler.refit.auth import RefitAuthenticator
from hamid.scheduler.signing import describe
from hamid.scheduler.ui.access import KubeAccess, protect
from hamid.scheduler.ui.routes import add_ui
from hamid.scheduler.ui.source import PodIndex, UiSource
from hamid.tls import ReloadingServerContext, server_ssl_context

log = get_logger("scheduler.app")

#: Builds a route registrar for the cluster app from the running scheduler (e.g. ``POST /refit``).
RouteFactory = Callable[[Scheduler, SchedulerOptions], RouteRegistrar]


def authenticator_from_options(host: RefitHost, options: SchedulerOptions) -> RefitAuthenticator:
    """The caller authenticator the ``hamid scheduler`` flags describe (``--refit-auth`` & co)."""
    return RefitAuthenticator(
        options.refit_auth,
        kube=host.kube,
        verifies_client_certs=bool(options.client_ca_file and options.tls_cert_file and options.tls_key_file),
        device_plugin_namespace=options.device_plugin_namespace,
        device_plugin_service_account=options.device_plugin_service_account,
        token_audience=options.refit_token_audience,
        hami_plugin_service_account=options.refit_hami_plugin_service_account,
    )


def refit_route_factory(host: RefitHost, options: SchedulerOptions) -> RouteRegistrar:
    """``run_scheduler(options, extra_routes=[refit_route_factory])``: ``POST /refit`` per the flags."""
    return refit_routes(host, authenticator_from_options(host, options))


#: The cluster app's routes of ``hamid scheduler``: ``POST /refit`` per the ``--refit-*`` flags.
DEFAULT_ROUTES: tuple[RouteFactory, ...] = (refit_route_factory,)


class SchedulerApp:
    """One scheduler replica: :meth:`start` → bound ports, :meth:`wait_synced`, :meth:`stop`."""

    def __init__(
        self,
        options: SchedulerOptions,
        *,
        kube: KubeClient | None = None,
        events: EventRecorder | None = None,
        routes: Sequence[RouteFactory] = DEFAULT_ROUTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self._clock = clock
        #: Bound ports by listener: ``extender``, ``cluster``, ``metrics``.
        self.ports: dict[str, int] = {}
        self._kube = kube
        self._owns_kube = kube is None
        self._events = events
        self._routes = tuple(routes)
        self._scheduler: Scheduler | None = None
        self._tls: ReloadingServerContext | None = None
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def scheduler(self) -> Scheduler:
        """The running scheduler (after :meth:`start`)."""
        if self._scheduler is None:
            raise RuntimeError("the scheduler app is not started")
        return self._scheduler

    async def start(self, *, run: bool = True) -> dict[str, int]:
        """Connect, build, bind every listener and start the tasks; the bound ports.

        ``run=False`` binds the listeners without starting the scheduler's caches (tests of a
        replica that has not synced yet). A failure stops whatever was started, then raises.
        """
        options = self.options
        try:
            self._tls = self._tls_context()
            if self._kube is None:
                self._kube = await connect(
                    options.api_server, options.kubeconfig, request_timeout=options.settings.api_timeout_s
                )
            scheduler = Scheduler(
                self._kube,
                options.device_config,
                options.settings,
                self._events,
                clock=self._clock,
                keys=options.allocation_keys,
                accept_unsigned=options.allow_unsigned_allocations,
                annotation_writers=options.annotation_writers,
            )
            _log_signing(options)
            self._scheduler = scheduler
            # before any listener: with leader election a replica starts as a follower
            ha = leadership(scheduler, options) if options.leader_elect else None
            await self._serve(scheduler)
            if run:
                self._tasks.append(asyncio.create_task(scheduler.run(), name="scheduler"))
            if ha is not None:
                self._tasks += [asyncio.create_task(part.run(), name="leadership") for part in ha]
            if self._tls is not None:
                self._tasks.append(asyncio.create_task(self._tls.run(), name="tls-reload"))
        except BaseException:
            await self.stop()
            raise
        log.info(
            "scheduler_started",
            **self.ports,
            tls=self._tls is not None,
            leader_elect=options.leader_elect and options.leader_elect_mode,
            node_label_selector=str(options.settings.node_label_selector) or None,
            force_overwrite_default_scheduler=options.settings.force_overwrite_default_scheduler,
        )
        return dict(self.ports)

    def _tls_context(self) -> ReloadingServerContext | None:
        options = self.options
        if options.tls_cert_file and options.tls_key_file:
            return server_ssl_context(options.tls_cert_file, options.tls_key_file, options.client_ca_file)
        log.warning(
            "plain_http_listener",
            paths="/webhook,/refit",
            hint="set --tls-cert-file and --tls-key-file (development only)",
            listen=options.listen,
        )
        return None

    async def _serve(self, scheduler: Scheduler) -> None:
        options = self.options
        routes = [factory(scheduler, options) for factory in self._routes]
        cluster = cluster_app(scheduler.readiness, scheduler.admission, routes)
        extender = extender_app(scheduler.filtering.filter, scheduler.binder.bind)
        for key, app, listen, ctx in (
            ("extender", extender, options.extender_listen, None),
            ("cluster", cluster, options.listen, self._tls.context if self._tls else None),
            ("metrics", self._metrics_app(scheduler), options.metrics_listen, self._metrics_tls()),
        ):
            runner, self.ports[key] = await serve(app, listen, ctx, what=f"{key} listener")
            self._runners.append(runner)

    def _metrics_tls(self) -> ssl.SSLContext | None:
        """The metrics listener's TLS context (``--metrics-tls``); warns when ``--metrics-auth``
        tokens would travel in clear text."""
        if self.options.metrics_tls and self._tls is not None:
            return self._tls.context
        if self.options.metrics_auth:
            log.warning(
                "metrics_auth_plain_http",
                listen=self.options.metrics_listen,
                hint="bearer tokens cross the network in clear text: set --metrics-tls",
            )
        return None

    def _metrics_app(self, scheduler: Scheduler) -> web.Application:
        """``/metrics``, ``/metrics/hami`` and (``--ui``) ``/ui``; guarded with ``--metrics-auth``."""
        app = metrics_app(scheduler.metrics, scheduler.readiness)
        if self.options.ui:
            add_ui(app, ui_source(scheduler), self.options.ui_hosts)
        if self.options.metrics_auth:
            protect(app, KubeAccess(scheduler.kube, timeout=self.options.settings.api_timeout_s))
        return app

    async def wait_synced(self, timeout: float = 15.0) -> None:
        """Wait until the pod, node and quota caches applied their first list."""
        async with asyncio.timeout(timeout):
            await self.scheduler.wait_synced()

    async def wait(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; a task that fails raises here (after :meth:`stop`)."""
        waiter = asyncio.create_task(stop.wait(), name="stop")
        try:
            done, _ = await asyncio.wait([waiter, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        for task in done:
            error = None if task is waiter or task.cancelled() else task.exception()
            if error is not None:
                raise error
        log.info("scheduler_stopping")

    async def stop(self) -> None:
        """Stop promptly, in an order that hands over cleanly.

        The listeners stop accepting first; the scheduler stops deciding and answers the binds
        waiting for a node lock; requests still in flight get :data:`hamid.listen.SHUTDOWN_GRACE_S`;
        binds still running then are cancelled and undo their writes; only then
        are the tasks cancelled — leadership steps down and releases its Lease, so another
        replica takes over within its retry period while nothing of this one still writes.
        """
        runners, self._runners = self._runners, []
        for runner in runners:
            for site in list(runner.sites):
                await site.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        for runner in reversed(runners):
            await runner.cleanup()
        if self._scheduler is not None:
            await self._scheduler.drain()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            await scheduler.close()
        if self._kube is not None and self._owns_kube:
            await self._kube.close()
            self._kube = None


def _log_signing(options: SchedulerOptions) -> None:
    """Say at start-up which allocations this replica will trust (docs/trust.md)."""
    keys = options.allocation_keys
    if keys is None:
        log.warning(
            "allocation_signing_disabled",
            hint="set --allocation-key-file: after a restart any allocation a pod carries is booked",
        )
        return
    log.info(
        "allocation_signing",
        key_ids=describe(keys.keys),
        signing_key=describe(keys.keys[-1:])[0],
        accept_unsigned=options.allow_unsigned_allocations,
    )


async def run_scheduler(
    options: SchedulerOptions,
    extra_routes: Sequence[RouteFactory] = DEFAULT_ROUTES,
    stop: asyncio.Event | None = None,
    ready: Callable[[Scheduler, dict[str, int]], None] | None = None,
) -> None:
    """Run one :class:`SchedulerApp` until ``stop`` is set; ``ready(scheduler, ports)`` once serving."""
    app = SchedulerApp(options, routes=extra_routes)
    try:
        ports = await app.start()
        if ready is not None:
            ready(app.scheduler, ports)
        await app.wait(stop or asyncio.Event())
    finally:
        await app.stop()


def ui_source(scheduler: Scheduler) -> UiSource:
    """What ``/ui`` reads of ``scheduler`` (its pod index follows the pod cache from now on)."""
    index = PodIndex()
    index.follow(scheduler.pods)
    return UiSource(
        scheduler.ledger,
        scheduler.numa,
        scheduler.pods,
        index,
        scheduler.metrics,
        scheduler.history,
        lambda: scheduler.leading,
        lambda: scheduler.synced,
    )


def leadership(
    scheduler: Scheduler, options: SchedulerOptions
) -> tuple[Leadership, LeaderElector | LeaseFollower]:
    """The replica's terms/role labels and the elector driving them (``--leader-elect-mode``)."""
    retry = options.leader_elect_retry_period_s
    identity = options.leader_identity or socket.gethostname()
    try:
        terms = Leadership(
            scheduler.kube,
            scheduler.readiness,
            scheduler.caches,
            api_timeout_s=options.settings.api_timeout_s,
            pod_name=options.pod_name,
            pod_namespace=options.pod_namespace,
            pod_selector=options.scheduler_pod_selector,
            retry_delay=retry,
        )
        elector: LeaderElector | LeaseFollower
        if options.leader_elect_mode == "campaign":
            elector = LeaderElector(
                scheduler.kube,
                options.leader_elect_namespace,
                options.leader_elect_name,
                f"{identity}_{uuid.uuid4().hex[:8]}",
                lease_duration=options.leader_elect_lease_duration_s,
                renew_deadline=options.leader_elect_renew_deadline_s,
                retry_period=retry,
                on_started_leading=terms.started,
                on_stopped_leading=terms.stopped,
            )
        else:
            elector = LeaseFollower(
                scheduler.kube,
                options.leader_elect_namespace,
                options.leader_elect_name,
                identity,
                poll_interval=retry,
                request_timeout=options.settings.api_timeout_s,
                on_started_leading=terms.started,
                on_stopped_leading=terms.stopped,
            )
    except ValueError as exc:
        raise InvalidInput(f"leader election: {exc}") from None
    scheduler.readiness.fence(elector)
    return terms, elector

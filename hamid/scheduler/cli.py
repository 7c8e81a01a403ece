"""`hamid scheduler` command: extender, webhook, probes and metrics listeners; leadership.

With ``--leader-elect`` the replica follows the Lease of the kube-scheduler in its pod (mode
``follow``, HAMi's model) or campaigns for its own Lease (mode ``campaign``, when no
kube-scheduler runs beside it); terms and role labels are in :mod:`hamid.scheduler.ha`.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import click
from aiohttp import web

from hamid.fit.policy import GPU_POLICIES, NODE_POLICIES
from hamid.kube.client import connect
from hamid.kube.errors import KubeError
from hamid.kube.leader import LeaderElector, LeaseFollower
from hamid.listen import LISTEN
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.model.resources import DeviceConfig, load_device_config
from hamid.options import option
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.ha import Leadership
from hamid.scheduler.http import RouteRegistrar, cluster_app, extender_app, metrics_app, serve
from hamid.scheduler.refit import refit_route_factory
from hamid.scheduler.refit_auth import (
    DEFAULT_TOKEN_AUDIENCE,
    METHODS,
    MTLS,
    TOKEN,
    ServiceAccount,
    parse_methods,
)
from hamid.tls import ReloadingServerContext, server_ssl_context

log = get_logger("scheduler.cli")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_ZERO = re.compile(r"0+(?:\.0*)?(?:ns|us|µs|ms|s|m|h)?")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
LEADER_ELECT_MODES = ("follow", "campaign")
DEFAULT_POD_SELECTOR = "app.kubernetes.io/name=hamid,app.kubernetes.io/component=scheduler"


def parse_duration(text: str) -> timedelta:
    """A Go duration (``5m``, ``1h30m``, ``300ms``) as a timedelta; must be positive."""
    value = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(value):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not value or pos != len(value) or total <= 0:
        raise InvalidInput(f"{text!r} is not a positive duration like 5m, 30s or 1h30m")
    return timedelta(seconds=total)


def parse_interval(text: str) -> float:
    """Seconds of a Go duration that may be zero (``0`` or ``0s``: disabled); see :func:`parse_duration`."""
    value = text.strip()
    if _ZERO.fullmatch(value):
        return 0.0
    return parse_duration(value).total_seconds()


@dataclass(frozen=True)
class SchedulerOptions:
    """Every ``hamid scheduler`` option (the refit routes read the ``refit_*``/``device_plugin_*`` ones)."""

    extender_listen: str = "127.0.0.1:9444"
    listen: str = "0.0.0.0:9443"
    metrics_listen: str = ":9395"
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    leader_elect: bool = False
    leader_elect_namespace: str = "kube-system"
    leader_elect_name: str = "hami-scheduler"
    leader_elect_mode: str = "follow"
    leader_elect_retry_period_s: float = 2.0
    leader_identity: str | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    scheduler_pod_selector: str = DEFAULT_POD_SELECTOR
    api_server: str | None = None
    kubeconfig: str | None = None
    device_plugin_namespace: str = "kube-system"
    device_plugin_service_account: str = "hami-device-plugin"
    refit_auth: tuple[str, ...] = METHODS
    #: Audience TokenReview checks refit tokens against ("" = the API server's default audience).
    refit_token_audience: str = DEFAULT_TOKEN_AUDIENCE
    #: Mixed fleets: upstream HAMi plugins' ServiceAccount, whose default tokens /refit accepts.
    refit_hami_plugin_service_account: ServiceAccount | None = None


#: Builds a route registrar for the cluster app from the running scheduler (e.g. ``POST /refit``).
RouteFactory = Callable[[Scheduler, SchedulerOptions], RouteRegistrar]


async def run_scheduler(
    options: SchedulerOptions,
    extra_routes: Sequence[RouteFactory] = (),
    stop: asyncio.Event | None = None,
    ready: Callable[[Scheduler, dict[str, int]], None] | None = None,
) -> None:
    """Run the scheduler until ``stop`` is set (or SIGTERM/SIGINT); every task is owned here.

    ``ready`` is called with the scheduler and the bound ports (``extender``, ``cluster``,
    ``metrics``) once all listeners are up.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            log.debug("signal_handler_unavailable", signal=sig.name)
    tls: ReloadingServerContext | None = None
    if options.tls_cert_file and options.tls_key_file:
        tls = server_ssl_context(options.tls_cert_file, options.tls_key_file, options.client_ca_file)
    elif options.tls_cert_file or options.tls_key_file:
        raise InvalidInput("--tls-cert-file and --tls-key-file must be given together")
    else:
        log.warning(
            "NO TLS: --listen serves /webhook and /refit over PLAIN HTTP; set --tls-cert-file and "
            "--tls-key-file (development only)",
            listen=options.listen,
        )
    kube = await connect(
        options.api_server, options.kubeconfig, request_timeout=options.settings.api_timeout_s
    )
    scheduler = Scheduler(kube, options.device_config, options.settings)
    runners: list[web.AppRunner] = []
    try:
        # before any listener: with leader election a replica starts as a follower
        ha = _leadership(scheduler, options) if options.leader_elect else None
        cluster = cluster_app(scheduler, [factory(scheduler, options) for factory in extra_routes])
        ports: dict[str, int] = {}
        for key, app, listen, ctx in (
            ("extender", extender_app(scheduler), options.extender_listen, None),
            ("cluster", cluster, options.listen, tls.context if tls else None),
            ("metrics", metrics_app(scheduler), options.metrics_listen, None),
        ):
            runner, ports[key] = await serve(app, listen, ctx, what=f"{key} listener")
            runners.append(runner)
        log.info(
            "scheduler_started",
            **ports,
            tls=tls is not None,
            leader_elect=options.leader_elect and options.leader_elect_mode,
        )
        if ready is not None:
            ready(scheduler, ports)
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(scheduler.run())]
            if ha is not None:
                tasks += [tg.create_task(ha[0].run()), tg.create_task(ha[1].run())]
            if tls is not None:
                tasks.append(tg.create_task(tls.run()))
            await stop.wait()
            log.info("scheduler_stopping")
            for task in tasks:
                task.cancel()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        await scheduler.close()
        await kube.close()


def _leadership(
    scheduler: Scheduler, options: SchedulerOptions
) -> tuple[Leadership, LeaderElector | LeaseFollower]:
    """The replica's terms/role labels and the elector driving them (``--leader-elect-mode``)."""
    retry = options.leader_elect_retry_period_s
    identity = options.leader_identity or socket.gethostname()
    try:
        leadership = Leadership(
            scheduler,
            pod_name=options.pod_name,
            pod_namespace=options.pod_namespace,
            pod_selector=options.scheduler_pod_selector,
            retry_delay=retry,
        )
        if options.leader_elect_mode == "campaign":
            return leadership, LeaderElector(
                scheduler.kube,
                options.leader_elect_namespace,
                options.leader_elect_name,
                f"{identity}_{uuid.uuid4().hex[:8]}",
                retry_period=retry,
                on_started_leading=leadership.started,
                on_stopped_leading=leadership.stopped,
            )
        if options.leader_elect_mode == "follow":
            return leadership, LeaseFollower(
                scheduler.kube,
                options.leader_elect_namespace,
                options.leader_elect_name,
                identity,
                poll_interval=retry,
                request_timeout=options.settings.api_timeout_s,
                on_started_leading=leadership.started,
                on_stopped_leading=leadership.stopped,
            )
    except ValueError as exc:
        raise InvalidInput(f"leader election: {exc}") from None
    raise InvalidInput(
        f"unknown leader election mode {options.leader_elect_mode!r} (use {', '.join(LEADER_ELECT_MODES)})"
    )


def _load_device_config(path: str | None) -> DeviceConfig:
    if not path:
        return DeviceConfig()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--device-config-file") from exc
    try:
        return load_device_config(text)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--device-config-file") from exc


@click.command("scheduler")
@option(
    "--extender-listen",
    type=LISTEN,
    default="127.0.0.1:9444",
    help="host:port of the kube-scheduler extender (/filter, /bind), plain HTTP.",
)
@option(
    "--listen",
    type=LISTEN,
    default="0.0.0.0:9443",
    help="host:port of /webhook, /healthz, /readyz (and /refit); TLS with the cert flags.",
)
@option(
    "--metrics-listen",
    type=LISTEN,
    default=":9395",
    help="host:port of Prometheus /metrics (hamid's names) and /metrics/hami (HAMi's names).",
)
@option(
    "--tls-cert-file", default=None, help="PEM server certificate for --listen (reloaded when it changes)."
)
@option("--tls-key-file", default=None, help="PEM private key of --tls-cert-file.")
@option(
    "--client-ca-file", default=None, help="PEM CA verifying client certificates (mTLS callers of /refit)."
)
@option("--scheduler-name", default="hami-scheduler", help="schedulerName the webhook sets on GPU pods.")
@option(
    "--node-scheduler-policy",
    type=click.Choice(NODE_POLICIES),
    default="binpack",
    help="Default node policy (pod annotation hami.io/node-scheduler-policy overrides).",
)
@option(
    "--gpu-scheduler-policy",
    default="spread",
    help="Default GPU policy: binpack, spread, mutex, numa, topology-aware or a comma chain "
    "(pod annotation hami.io/gpu-scheduler-policy overrides).",
)
@option("--device-config-file", default=None, help="HAMi device-config YAML (its nvidia: section).")
@option(
    "--node-lock-timeout",
    default="5m",
    help="Age after which a node lock (hami.io/mutex.lock) expires; a holder still Pending and "
    "unallocated keeps it longer (see --node-lock-max-hold).",
)
@option(
    "--node-lock-max-hold",
    default="30m",
    help="Hard cap on how long a pod still Pending and unallocated keeps a node lock past "
    "--node-lock-timeout; after it the lock is taken over with a warning. At least --node-lock-timeout.",
)
@option("--bind-wait", default="25s", help="How long a bind waits for a contended node lock before failing.")
@option(
    "--reconcile-interval",
    default="5m",
    help="How often the leader checks its GPU accounting against a fresh LIST of pods and repairs "
    "drift (missed watch events): logged, counted in hamid_reconcile_drift_total; 0 disables.",
)
@option(
    "--leader-elect/--no-leader-elect",
    default=False,
    help="Only one replica decides (/filter /bind /refit); see --leader-elect-mode.",
)
@option(
    "--leader-elect-mode",
    type=click.Choice(LEADER_ELECT_MODES),
    default="follow",
    help="follow: lead while the kube-scheduler in this pod holds the Lease named below (its "
    "holderIdentity starts with '<--leader-identity>_'); campaign: campaign for that Lease "
    "(no kube-scheduler beside hamid; never name kube-scheduler's Lease then).",
)
@option("--leader-elect-namespace", default="kube-system", help="Namespace of the leader-election Lease.")
@option(
    "--leader-elect-name",
    default="hami-scheduler",
    help="Name of the leader-election Lease (in follow mode: kube-scheduler's resourceName).",
)
@option(
    "--leader-elect-retry-period",
    default="2s",
    help="How often the Lease is read (follow) or acquisition is retried (campaign).",
)
@option(
    "--leader-identity",
    default=None,
    help="This replica's hostname in Lease holder identities (default: the pod's hostname).",
)
@option("--pod-name", aliases=["POD_NAME"], default=None, help="This scheduler's pod (role labels).")
@option("--pod-namespace", aliases=["POD_NAMESPACE"], default=None, help="Namespace of --pod-name.")
@option(
    "--scheduler-pod-selector",
    default=DEFAULT_POD_SELECTOR,
    help="Label selector of all scheduler pods in --pod-namespace; the leader labels them "
    "hami.io/scheduler-role=follower and its own pod leader.",
)
@option(
    "--api-server",
    default=None,
    help="API server URL (no auth, e.g. the embedded one); default kubeconfig/in-cluster.",
)
@option("--kubeconfig", default=None, help="kubeconfig file (default $KUBECONFIG, then in-cluster).")
@option(
    "--device-plugin-namespace",
    default="kube-system",
    help="Namespace of the device plugin ServiceAccount (/refit token auth).",
)
@option(
    "--device-plugin-service-account",
    default="hami-device-plugin",
    help="ServiceAccount of the device plugin (/refit token auth).",
)
@option(
    "--refit-auth",
    default=None,
    help="Accepted /refit caller authentication: comma list of mtls, token "
    "[default: token, plus mtls when --client-ca-file is set].",
)
@option(
    "--refit-token-audience",
    default=DEFAULT_TOKEN_AUDIENCE,
    help="Audience a /refit bearer token must be issued for (TokenReview spec.audiences); the "
    "plugin sends a projected token with this audience, so its API-server token is never sent. "
    "Empty: the API server's default audience.",
)
@option(
    "--refit-hami-plugin-service-account",
    default="",
    help="Mixed fleets with upstream HAMi device plugins: their ServiceAccount <namespace>/<name>. "
    "/refit then also accepts that ServiceAccount's default (API-server audience) bound token, "
    "with the same pod and node checks. Empty (default): only --refit-token-audience tokens.",
)
def scheduler_command(**kw: str | bool | None) -> None:
    """Run the scheduler extender, the mutating webhook and the metrics endpoint."""
    try:
        refit_auth = (
            parse_methods(str(kw["refit_auth"])) if kw["refit_auth"] is not None else default_refit_auth(kw)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--refit-auth") from exc
    try:
        hami_plugins = ServiceAccount.parse(str(kw["refit_hami_plugin_service_account"] or ""))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--refit-hami-plugin-service-account") from exc
    try:
        lock_timeout = parse_duration(str(kw["node_lock_timeout"]))
        lock_max_hold = parse_duration(str(kw["node_lock_max_hold"]))
        if lock_max_hold < lock_timeout:
            raise click.BadParameter(
                f"{kw['node_lock_max_hold']} is shorter than --node-lock-timeout {kw['node_lock_timeout']}",
                param_hint="--node-lock-max-hold",
            )
        gpu_policy = str(kw["gpu_scheduler_policy"])
        unknown = sorted({t.strip() for t in gpu_policy.split(",")} - set(GPU_POLICIES))
        if unknown:
            raise click.BadParameter(
                f"unknown policy {', '.join(map(repr, unknown))} in {gpu_policy!r}; "
                f"use {', '.join(GPU_POLICIES)} or a comma chain of them",
                param_hint="--gpu-scheduler-policy",
            )
        settings = SchedulerSettings(
            scheduler_name=str(kw["scheduler_name"]),
            node_policy=str(kw["node_scheduler_policy"]),
            gpu_policy=gpu_policy,
            node_lock_timeout=lock_timeout,
            node_lock_max_hold=lock_max_hold,
            bind_wait_s=parse_duration(str(kw["bind_wait"])).total_seconds(),
            reconcile_interval_s=parse_interval(str(kw["reconcile_interval"])),
            gc_freeze=True,
        )
        retry_period = parse_duration(str(kw["leader_elect_retry_period"])).total_seconds()
    except InvalidInput as exc:
        raise click.BadParameter(str(exc)) from exc
    options = SchedulerOptions(
        extender_listen=str(kw["extender_listen"]),
        listen=str(kw["listen"]),
        metrics_listen=str(kw["metrics_listen"]),
        tls_cert_file=_opt(kw["tls_cert_file"]),
        tls_key_file=_opt(kw["tls_key_file"]),
        client_ca_file=_opt(kw["client_ca_file"]),
        settings=settings,
        device_config=_load_device_config(_opt(kw["device_config_file"])),
        leader_elect=bool(kw["leader_elect"]),
        leader_elect_namespace=str(kw["leader_elect_namespace"]),
        leader_elect_name=str(kw["leader_elect_name"]),
        leader_elect_mode=str(kw["leader_elect_mode"]),
        leader_elect_retry_period_s=retry_period,
        leader_identity=_opt(kw["leader_identity"]),
        pod_name=_opt(kw["pod_name"]),
        pod_namespace=_opt(kw["pod_namespace"]),
        scheduler_pod_selector=str(kw["scheduler_pod_selector"] or ""),
        api_server=_opt(kw["api_server"]),
        kubeconfig=_opt(kw["kubeconfig"]),
        device_plugin_namespace=str(kw["device_plugin_namespace"]),
        device_plugin_service_account=str(kw["device_plugin_service_account"]),
        refit_auth=refit_auth,
        refit_token_audience=str(kw["refit_token_audience"] or ""),
        refit_hami_plugin_service_account=hami_plugins,
    )
    try:
        asyncio.run(run_scheduler(options, extra_routes=[refit_route_factory]))
    except* (InvalidInput, KubeError) as group:
        raise click.ClickException("; ".join(str(e) for e in group.exceptions)) from None


def default_refit_auth(kw: dict[str, str | bool | None]) -> tuple[str, ...]:
    """``token``, plus ``mtls`` when a client CA is configured (so a start without mTLS never warns)."""
    return (MTLS, TOKEN) if kw["client_ca_file"] else (TOKEN,)


def _opt(value: str | bool | None) -> str | None:
    return str(value) if value else None

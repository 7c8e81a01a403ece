"""aiohttp apps of ``hamid scheduler``: extender, cluster (webhook, probes, extra routes), metrics.

Request bodies over 1 MiB answer 413 and a body that is not JSON answers 400 with the reason.
Extender arguments of the wrong shape are answered in-band like HAMi does (HTTP 200 with
``Error``, e.g. ``extender args missing pod``); an AdmissionReview of the wrong shape answers
400, a malformed pod inside a valid one is denied with the reason. Nothing changes in any case.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Metric, generate_latest
from prometheus_client.registry import Collector

from hamid.listen import parse_listen as parse_listen  # re-exported
from hamid.listen import serve as serve  # re-exported
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.scheduler.extender_json import (
    BindArgs,
    FilterArgs,
    FilterResult,
    decode_bind_args,
    decode_filter_args,
)
from hamid.scheduler.metrics import CLUSTER_METRICS, SchedulerMetrics
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.webhook import Admission

log = get_logger("scheduler.http")

MAX_BODY_BYTES = 1024 * 1024
#: The deepest nesting of lists and objects a request body may have (Kubernetes objects: < 20).
MAX_JSON_DEPTH = 64
#: Adds routes to the cluster app (``--listen``), e.g. ``POST /refit``.
RouteRegistrar = Callable[[web.Application], None]


#: The filter verb ``/filter`` calls (:meth:`hamid.scheduler.filter.Filter.filter`).
FilterVerb = Callable[[FilterArgs], Awaitable[FilterResult]]
#: The bind verb ``/bind`` calls (:meth:`hamid.scheduler.bind.Binder.bind`): the error, "" when bound.
BindVerb = Callable[[BindArgs], Awaitable[str]]

FILTER_KEY: web.AppKey[FilterVerb] = web.AppKey("filter")
BIND_KEY: web.AppKey[BindVerb] = web.AppKey("bind")
READINESS_KEY = web.AppKey("readiness", Readiness)
ADMISSION_KEY = web.AppKey("admission", Admission)
METRICS_KEY = web.AppKey("metrics", SchedulerMetrics)


def bad_request(reason: str) -> web.Response:
    """400 with ``{"error": reason}``."""
    return web.json_response({"error": reason}, status=400)


def parse_json_body(body: bytes) -> Any:
    """A request body decoded as JSON; :class:`InvalidInput` with the reason when it is not.

    UTF-8, standard JSON only (no ``NaN``/``Infinity``), nested at most :data:`MAX_JSON_DEPTH`
    deep: deeper bodies would exhaust the recursion of every later walk over them.
    """
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidInput(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"malformed JSON body: {exc}") from None
    if _depth_exceeds(body, value, MAX_JSON_DEPTH):
        raise InvalidInput(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


#: The container types ``json.loads`` builds (exactly these: no subclasses).
_CONTAINERS = frozenset((dict, list))


def _depth_exceeds(body: bytes, value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded from ``body``) nests lists/objects more than ``limit`` deep.

    A text with at most ``limit`` opening brackets cannot (two counts at C speed); otherwise the
    containers are walked, each one's children typed at C speed, so a list of 1,000 node names (a
    ``/filter`` body) is one step, not 1,000. Iterative: no recursion.
    """
    if type(value) not in _CONTAINERS or body.count(b"[") + body.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item
        if _CONTAINERS.isdisjoint(map(type, children)):
            continue
        if depth >= limit:
            return True
        stack.extend([(child, depth + 1) for child in children if type(child) in _CONTAINERS])
    return False


async def read_body(request: web.Request) -> bytes:
    """The request body; raises 413 (too large) or 400 (a ``Content-Encoding`` it is not in)."""
    try:
        return await request.read()  # aiohttp raises 413 above client_max_size
    except web.RequestPayloadError as exc:  # e.g. "Content-Encoding: gzip" on a plain body
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"cannot read the request body: {exc}"}),
            content_type="application/json",
        ) from None


async def read_json(request: web.Request) -> Any:
    """The request body as JSON (:func:`parse_json_body`); raises 413 (too large) or 400 HTTP errors."""
    body = await read_body(request)
    try:
        return parse_json_body(body)
    except InvalidInput as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": str(exc)}), content_type="application/json"
        ) from None


async def _filter(request: web.Request) -> web.Response:
    try:
        args = decode_filter_args(await read_json(request))
    except InvalidInput as exc:
        return web.json_response(FilterResult(error=str(exc)).to_json())
    try:
        result = await request.app[FILTER_KEY](args)
    except InvalidInput as exc:  # a malformed pod part only a later reader checks
        result = FilterResult(error=str(exc))
    except Exception as exc:  # never a 500: kube-scheduler reads the reason and retries the pod
        log.error("filter_error", error=repr(exc)[:500])
        log.debug("filter_error_trace", exc_info=True)
        result = FilterResult(error=f"filter failed: {type(exc).__name__}: {str(exc)[:300]}")
    return web.json_response(result.to_json())


async def _bind(request: web.Request) -> web.Response:
    try:
        args = decode_bind_args(await read_json(request))
    except InvalidInput as exc:
        return web.json_response({"Error": str(exc)})
    error = await request.app[BIND_KEY](args)
    return web.json_response({"Error": error} if error else {})


async def _webhook(request: web.Request) -> web.Response:
    try:
        answer = request.app[ADMISSION_KEY].respond(await read_json(request))
    except InvalidInput as exc:
        return bad_request(str(exc))
    return web.json_response(answer)


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    reason = request.app[READINESS_KEY].reason()
    if reason:
        return web.Response(status=503, text=f"not ready: {reason}")
    return web.Response(text="ok")


async def _readyz_webhook(request: web.Request) -> web.Response:
    """Ready to answer /webhook (any role): the caches have applied their first list."""
    if not request.app[READINESS_KEY].synced:
        return web.Response(status=503, text="not ready: caches not synced")
    return web.Response(text="ok")


class _FollowerView(Collector):
    """A registry without the cluster families (what a follower exports)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.registry.collect() if family.name not in CLUSTER_METRICS)


async def _metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS_KEY].registry
    leading = request.app[READINESS_KEY].leading
    payload = generate_latest(registry if leading else _FollowerView(registry))
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _hami_metrics(request: web.Request) -> web.Response:
    """HAMi's metric names (leader only: every family describes the cluster)."""
    leading = request.app[READINESS_KEY].leading
    payload = generate_latest(request.app[METRICS_KEY].hami_registry) if leading else b""
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


def extender_app(filter_verb: FilterVerb, bind_verb: BindVerb) -> web.Application:
    """``POST /filter`` and ``POST /bind`` (kube-scheduler extender, loopback by default)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[FILTER_KEY] = filter_verb
    app[BIND_KEY] = bind_verb
    app.router.add_post("/filter", _filter)
    app.router.add_post("/bind", _bind)
    return app


def cluster_app(
    readiness: Readiness, admission: Admission, extra_routes: Sequence[RouteRegistrar] = ()
) -> web.Application:
    """``POST /webhook``, ``GET /healthz``, ``GET /readyz[/webhook]`` plus ``extra_routes``'s routes.

    ``/readyz`` is 200 only on the replica that decides (synced, leader, term synced);
    ``/readyz/webhook`` is 200 on every replica whose caches are synced (followers answer the webhook).
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[READINESS_KEY] = readiness
    app[ADMISSION_KEY] = admission
    app.router.add_post("/webhook", _webhook)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/readyz/webhook", _readyz_webhook)
    for register in extra_routes:
        register(app)
    return app


def metrics_app(metrics: SchedulerMetrics, readiness: Readiness) -> web.Application:
    """``GET /metrics`` (Prometheus text format) and ``GET /metrics/hami`` (HAMi's names, leader only)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[METRICS_KEY] = metrics
    app[READINESS_KEY] = readiness
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/hami", _hami_metrics)
    return app

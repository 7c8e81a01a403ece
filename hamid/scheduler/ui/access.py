"""Kubernetes authentication of the metrics listener (``--metrics-auth``): ``/metrics*`` and ``/ui*``.

As kube-rbac-proxy does: the caller's bearer token is checked by a TokenReview (the API
server's own audience), and the user it names must be allowed by a SubjectAccessReview for
verb ``get`` on the request's path (``nonResourceAttributes``), so RBAC decides with a
ClusterRole such as ``nonResourceURLs: ["/metrics", "/metrics/hami", "/ui", "/ui/*"]``.
No token: 401 with ``WWW-Authenticate: Bearer``; a token the API server rejects: 401; not
allowed: 403; the API server unreachable: 503 — each with the reason and the view's security
headers, and nothing served. Answers are cached per (token hash, path) for :data:`CACHE_TTL_S`
(the page script polls), granted and refused ones apart, each bounded and evicting its least
recently used entry: forged tokens, refused, cannot push a reader's cached grant out.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hamid.kube.client import KubeClient, Resource
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.scheduler.refit.auth import bearer_token
from hamid.scheduler.ui.routes import SECURITY_HEADERS

log = get_logger("scheduler.ui.access")

SUBJECT_ACCESS_REVIEWS = Resource(
    "/apis/authorization.k8s.io/v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
#: Path prefixes the authentication guards on the metrics listener.
PROTECTED = ("/metrics", "/ui")
#: Seconds a decision is reused for the same token and path.
CACHE_TTL_S = 30.0
#: Decisions cached at most, granted and refused each (past it the least recently used goes).
CACHE_MAX = 4096
REALM = 'Bearer realm="hamid"'


@dataclass(frozen=True, slots=True)
class Decision:
    """HTTP status to answer with (200: serve) and why."""

    status: int
    reason: str = ""


ALLOWED = Decision(200)


def guarded(path: str) -> bool:
    """Whether ``path`` is one the authentication guards."""
    return any(path == p or path.startswith(p + "/") for p in PROTECTED)


class KubeAccess:
    """TokenReview then SubjectAccessReview through the scheduler's API client, cached briefly."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        timeout: float = 5.0,
        ttl_s: float = CACHE_TTL_S,
        cache_max: int = CACHE_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.timeout = timeout
        self.ttl_s = ttl_s
        self._clock = clock
        #: Granted and refused decisions apart: refusals (any client can make them) never evict grants.
        self._granted = _Decisions(cache_max)
        self._refused = _Decisions(cache_max)

    async def decide(self, token: str, path: str) -> Decision:
        """May the bearer of ``token`` GET ``path``?"""
        if not token:
            return Decision(401, "a bearer token is required (Authorization: Bearer <token>)")
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        now = self._clock()
        cached = self._granted.get(key, now) or self._refused.get(key, now)
        if cached is not None:
            return cached
        try:
            async with asyncio.timeout(self.timeout):
                decision = await self._review(token, path)
        except (KubeError, TimeoutError) as exc:
            log.warning("metrics_auth_unavailable", path=path, error=str(exc) or type(exc).__name__)
            return Decision(503, "the API server could not check the token; try again")
        (self._granted if decision.status == 200 else self._refused).put(key, now + self.ttl_s, decision)
        return decision

    async def _review(self, token: str, path: str) -> Decision:
        review = await self.kube.create_token_review(token, None, timeout=self.timeout)
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, f"token is not authenticated: {status.get('error') or 'rejected'}")
        user = status.get("user") or {}
        answer = await self.kube.create(
            SUBJECT_ACCESS_REVIEWS, subject_access_review(user, path, "get"), timeout=self.timeout
        )
        verdict = answer.get("status") or {}
        username = str(user.get("username") or "")
        if not verdict.get("allowed"):
            why = str(verdict.get("reason") or verdict.get("evaluationError") or "no RBAC rule allows it")
            return Decision(403, f"user {username!r} may not get {path}: {why}")
        return ALLOWED


class _Decisions:
    """Decisions by (token hash, path) until they expire; at most ``size``, least recently used out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], tuple[float, Decision]] = OrderedDict()

    def get(self, key: tuple[str, str], now: float) -> Decision | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: tuple[str, str], until: float, decision: Decision) -> None:
        self._items[key] = (until, decision)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def subject_access_review(user: Mapping[str, Any], path: str, verb: str) -> dict[str, Any]:
    """A SubjectAccessReview of ``verb`` on non-resource ``path`` for a TokenReview's user."""
    spec: dict[str, Any] = {
        "user": str(user.get("username") or ""),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.get("groups"):
        spec["groups"] = [str(g) for g in user["groups"]]
    if user.get("uid"):
        spec["uid"] = str(user["uid"])
    if user.get("extra"):
        spec["extra"] = {str(k): [str(v) for v in vs] for k, vs in dict(user["extra"]).items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def protect(app: web.Application, access: KubeAccess) -> None:
    """Guard ``app``'s ``/metrics*`` and ``/ui*`` paths with ``access`` (before the app starts)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not guarded(request.path):
            return await handler(request)
        decision = await access.decide(bearer_token(request.headers.get("Authorization")), request.path)
        if decision.status == 200:
            return await handler(request)
        headers = {**SECURITY_HEADERS, **({"WWW-Authenticate": REALM} if decision.status == 401 else {})}
        return web.Response(status=decision.status, text=decision.reason + "\n", headers=headers)

    app.middlewares.append(authenticate)

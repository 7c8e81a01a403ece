"""Kubernetes authentication of the metrics listener (``--metrics-auth``): ``/metrics*`` and ``/ui*``.

As kube-rbac-proxy does: the caller's bearer token is checked by a TokenReview (the API
server's own audience), and the user it names must be allowed by a SubjectAccessReview for
verb ``get`` on the request's path (``nonResourceAttributes``), so RBAC decides with a
ClusterRole such as ``nonResourceURLs: ["/metrics", "/metrics/hami", "/ui", "/ui/*"]``.
No token: 401 with ``WWW-Authenticate: Bearer``; a token the API server rejects: 401; not
allowed: 403; the API server unreachable: 503 — each with the reason, and nothing served.
Answers are cached per (token hash, path) for :data:`CACHE_TTL_S` (the page script polls).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hamid.kube.client import KubeClient, Resource
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.scheduler.refit.auth import bearer_token

log = get_logger("scheduler.ui.access")

SUBJECT_ACCESS_REVIEWS = Resource(
    "/apis/authorization.k8s.io/v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
#: Path prefixes the authentication guards on the metrics listener.
PROTECTED = ("/metrics", "/ui")
#: Seconds a decision is reused for the same token and path.
CACHE_TTL_S = 30.0
#: Decisions cached at most (the cache starts afresh past it).
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.timeout = timeout
        self.ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Decision]] = {}

    async def decide(self, token: str, path: str) -> Decision:
        """May the bearer of ``token`` GET ``path``?"""
        if not token:
            return Decision(401, "a bearer token is required (Authorization: Bearer <token>)")
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with asyncio.timeout(self.timeout):
                decision = await self._review(token, path)
        except (KubeError, TimeoutError) as exc:
            log.warning("metrics_auth_unavailable", path=path, error=str(exc) or type(exc).__name__)
            return Decision(503, "the API server could not check the token; try again")
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = (now + self.ttl_s, decision)
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
        headers = {"WWW-Authenticate": REALM} if decision.status == 401 else {}
        return web.Response(status=decision.status, text=decision.reason + "\n", headers=headers)

    app.middlewares.append(authenticate)

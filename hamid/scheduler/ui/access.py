"""Kubernetes authentication of the metrics listener (``--metrics-auth``): ``/metrics*`` and ``/ui*``.

As kube-rbac-proxy does: the caller's bearer token is checked by a TokenReview (the API
server's own audience), and the user it names must be allowed by a SubjectAccessReview for
verb ``get`` on the request's path (``nonResourceAttributes``), so RBAC decides with a
ClusterRole such as ``nonResourceURLs: ["/metrics", "/metrics/hami", "/ui", "/ui/*"]``.
No token: 401 with ``WWW-Authenticate: Bearer``; a token the API server rejects: 401; not
allowed: 403; the API server unreachable: 503 — each with the reason and the view's security
headers, and nothing served.

What it costs the API server, whose client the scheduler shares with scheduling: a token's
review is cached for :data:`CACHE_TTL_S` apart from the decisions per (token hash, path), so a
reader's new pages cost one SubjectAccessReview each; grants and refusals are cached apart,
each bounded and evicting its least recently used entry, so forged tokens cannot push a
reader's cached grant out; requests waiting on the same check share it; and checks not cached
are budgeted per client address (:data:`CHECKS_PER_S`, :data:`CHECK_BURST`) and in all
(:data:`CHECKS_IN_FLIGHT`): past either, 429 with ``Retry-After``, so a flood of forged tokens
costs the API server a bounded rate instead of one TokenReview each.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiohttp import web

from hamid.kube.client import KubeClient, Resource
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.scheduler.refit.auth import bearer_token
from hamid.scheduler.ui.routes import SECURITY_HEADERS

log = get_logger("scheduler.ui.access")

K = TypeVar("K")
V = TypeVar("V")

SUBJECT_ACCESS_REVIEWS = Resource(
    "/apis/authorization.k8s.io/v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
#: Path prefixes the authentication guards on the metrics listener.
PROTECTED = ("/metrics", "/ui")
#: Seconds a token's review, and a decision for a token and path, are reused.
CACHE_TTL_S = 30.0
#: Entries each cache holds at most (past it the least recently used goes).
CACHE_MAX = 4096
#: Checks not answered from the caches that one client address may start per second, and at once
#: after a quiet while (a browser's first page asks a handful of paths).
CHECKS_PER_S = 5.0
CHECK_BURST = 20
#: Checks not answered from the caches in flight at most, every client together, but those of
#: tokens allowed a path within :data:`KNOWN_TTL_S` (a reader's renewals never queue behind a
#: flood of forged tokens; a token RBAC refuses everything, any pod's ServiceAccount, gains nothing).
CHECKS_IN_FLIGHT = 16
KNOWN_TTL_S = 600.0
REALM = 'Bearer realm="hamid"'


@dataclass(frozen=True, slots=True)
class Decision:
    """HTTP status to answer with (200: serve), why, and (429) the seconds to wait."""

    status: int
    reason: str = ""
    retry_after_s: int = 0


ALLOWED = Decision(200)
#: A token's review: the user it names, or the refusal; and until when it holds.
Review = tuple[Mapping[str, Any] | Decision, float]


def guarded(path: str) -> bool:
    """Whether ``path`` is one the authentication guards."""
    return any(path == p or path.startswith(p + "/") for p in PROTECTED)


class KubeAccess:
    """TokenReview then SubjectAccessReview through the scheduler's API client, cached briefly
    and budgeted."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        timeout: float = 5.0,
        ttl_s: float = CACHE_TTL_S,
        cache_max: int = CACHE_MAX,
        checks_per_s: float = CHECKS_PER_S,
        check_burst: int = CHECK_BURST,
        checks_in_flight: int = CHECKS_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.timeout = timeout
        self.ttl_s = ttl_s
        self._clock = clock
        #: Granted and refused entries apart: refusals (any client can make them) never evict grants.
        self._granted: _Cache[tuple[str, str], Decision] = _Cache(cache_max)
        self._refused: _Cache[tuple[str, str], Decision] = _Cache(cache_max)
        self._users: _Cache[str, Mapping[str, Any]] = _Cache(cache_max)
        self._rejected: _Cache[str, Decision] = _Cache(cache_max)
        #: Tokens (hashes) allowed a path lately: their checks pass the cap of checks in flight.
        self._known: _Cache[str, bool] = _Cache(cache_max)
        #: Checks under way by (token hash, path), each its own task: a second request for one
        #: waits on it, and a first caller that hangs up does not cancel it for the others.
        self._checking: dict[tuple[str, str], asyncio.Task[Decision]] = {}
        #: TokenReviews under way by token hash, shared by the checks of its paths.
        self._reviewing: dict[str, asyncio.Task[Review]] = {}
        self._budgets = _Budgets(checks_per_s, check_burst, cache_max)
        self._checks_in_flight = checks_in_flight

    async def decide(self, token: str, path: str, client: str = "") -> Decision:
        """May the bearer of ``token``, calling from address ``client``, GET ``path``?"""
        if not token:
            return Decision(401, "a bearer token is required (Authorization: Bearer <token>)")
        digest = hashlib.sha256(token.encode()).hexdigest()
        key = (digest, path)
        now = self._clock()
        cached = self._granted.get(key, now) or self._refused.get(key, now)
        if cached is not None:
            return cached
        check = self._checking.get(key)
        if check is None:
            crowded = len(self._checking) >= self._checks_in_flight
            if crowded and not self._known.get(digest, now):
                return Decision(429, "too many token checks under way; retry shortly", 1)
            wait_s = self._budgets.take(client, now)
            if wait_s:
                return Decision(
                    429, f"too many token checks from {client or 'this client'}; retry later", wait_s
                )
            check = self._checking[key] = asyncio.create_task(self._check(token, digest, path))
            check.add_done_callback(lambda _: self._checking.pop(key, None))
        return await asyncio.shield(check)

    async def _check(self, token: str, digest: str, path: str) -> Decision:
        """The decision for a token and path not cached, cached for the next asker (503: not) no
        longer than the token's review it rests on holds."""
        try:
            async with asyncio.timeout(self.timeout):
                decision, until = await self._decision(token, digest, path)
        except (KubeError, TimeoutError) as exc:
            log.warning("metrics_auth_unavailable", path=path, error=str(exc) or type(exc).__name__)
            return Decision(503, "the API server could not check the token; try again")
        now = self._clock()
        cache = self._granted if decision.status == 200 else self._refused
        cache.put((digest, path), min(until, now + self.ttl_s), decision)
        if decision.status == 200:
            self._known.put(digest, now + KNOWN_TTL_S, True)
        return decision

    async def _decision(self, token: str, digest: str, path: str) -> tuple[Decision, float]:
        user, until = await self._user(token, digest)
        if isinstance(user, Decision):
            return user, until
        answer = await self.kube.create(
            SUBJECT_ACCESS_REVIEWS, subject_access_review(user, path, "get"), timeout=self.timeout
        )
        verdict = answer.get("status") or {}
        username = str(user.get("username") or "")
        if not verdict.get("allowed"):
            why = str(verdict.get("reason") or verdict.get("evaluationError") or "no RBAC rule allows it")
            return Decision(403, f"user {username!r} may not get {path}: {why}"), until
        return ALLOWED, until

    async def _user(self, token: str, digest: str) -> Review:
        """The user a TokenReview names for ``token`` (cached, one review at a time), or the 401."""
        now = self._clock()
        for cache in (self._users, self._rejected):
            known = cache.entry(digest, now)
            if known is not None:
                return known[1], known[0]
        review = self._reviewing.get(digest)
        if review is None:
            review = self._reviewing[digest] = asyncio.create_task(self._review(token, digest))
            review.add_done_callback(lambda _: self._reviewing.pop(digest, None))
        return await asyncio.shield(review)

    async def _review(self, token: str, digest: str) -> Review:
        review = await self.kube.create_token_review(token, None, timeout=self.timeout)
        status = review.get("status") or {}
        now = self._clock()
        until = now + self.ttl_s
        if not status.get("authenticated"):
            refusal = Decision(401, f"token is not authenticated: {status.get('error') or 'rejected'}")
            self._rejected.put(digest, until, refusal)
            return refusal, until
        user: Mapping[str, Any] = status.get("user") or {}
        self._users.put(digest, until, user)
        return user, until


class _Cache(Generic[K, V]):
    """Values by key until they expire; at most ``size``, the least recently used out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        entry = self.entry(key, now)
        return None if entry is None else entry[1]

    def entry(self, key: K, now: float) -> tuple[float, V] | None:
        """(until, value) of ``key`` while it holds."""
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item

    def put(self, key: K, until: float, value: V) -> None:
        self._items[key] = (until, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class _Budgets:
    """A token bucket of checks per client address (at most ``size`` addresses remembered, the
    least recently seen forgotten: a forgotten address starts with a full bucket)."""

    def __init__(self, per_s: float, burst: int, size: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self.size = size
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, client: str, now: float) -> int:
        """Spend one check of ``client``'s; 0 when it had one, else the whole seconds to wait."""
        level, since = self._buckets.get(client, (float(self.burst), now))
        level = min(float(self.burst), level + (now - since) * self.per_s)
        if level < 1:
            self._buckets[client] = (level, now)
            self._buckets.move_to_end(client)
            return max(1, math.ceil((1 - level) / self.per_s))
        self._buckets[client] = (level - 1, now)
        self._buckets.move_to_end(client)
        while len(self._buckets) > self.size:
            self._buckets.popitem(last=False)
        return 0


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
        token = bearer_token(request.headers.get("Authorization"))
        decision = await access.decide(token, request.path, request.remote or "")
        if decision.status == 200:
            return await handler(request)
        headers = dict(SECURITY_HEADERS)
        if decision.status == 401:
            headers["WWW-Authenticate"] = REALM
        if decision.retry_after_s:
            headers["Retry-After"] = str(decision.retry_after_s)
        return web.Response(status=decision.status, text=decision.reason + "\n", headers=headers)

    app.middlewares.append(authenticate)

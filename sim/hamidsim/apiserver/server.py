"""An in-memory Kubernetes API server over real HTTP, for tests and the demo.

kubernetes-asyncio talks to it unchanged (``Configuration(host=server.url)``). It keeps the
semantics hamid relies on: a global resourceVersion bumped by every write, 409 on stale
preconditions, merge / strategic-merge / JSON patch, list and watch with field and label selectors,
410 for a resourceVersion older than the kept history, ``pods/binding``, core and events.k8s.io
events (one storage, two views), leases, TokenReview for registered tokens, and fault injection.

Differences from a real server, on purpose: authentication only by the bearer tokens registered
here (none: ``system:anonymous``; an unknown one: 401) and no authorization (every user may do
everything; TokenReview answers only for tokens registered here, SubjectAccessReview only from
rules registered here), no admission beyond pod/namespace
defaults and the registered mutating webhooks (:mod:`.admission`), namespaces are created on
first use unless ``auto_namespaces=False``, pods are deleted at once unless
``graceful_pod_deletion=True``, paginated lists (``limit``/``continue``) read the current state
under the first page's resourceVersion, server-side apply is answered 415.

Admin endpoints (not subject to faults): ``GET|POST|DELETE /_sim/faults``, ``DELETE /_sim/faults/<id>``,
``POST /_sim/watches/close``, ``POST /_sim/tokens``, ``GET /_sim/stats``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from aiohttp import web

from hamid.log import get_logger
from hamid.model import objects
from hamidsim.apiserver.access import AccessRules
from hamidsim.apiserver.admission import MutatingAdmission
from hamidsim.apiserver.faults import Faults
from hamidsim.apiserver.handlers import MAX_BODY_BYTES, RequestHandler, unsupported_patch_type
from hamidsim.apiserver.patch import PATCH_TYPES
from hamidsim.apiserver.resources import (
    BY_STORAGE,
    Resource,
    lookup_kind,
)
from hamidsim.apiserver.select import compile_selectors
from hamidsim.apiserver.store import Change, Store, Stored, dumps, resource_of
from hamidsim.apiserver.tokens import TokenRegistry


def _log() -> Any:
    """The module logger, looked up per use so it follows ``hamid.log.configure`` (stderr, format)."""
    return get_logger("sim.apiserver")


class ApiServer:
    """The embedded API server: an aiohttp app over a :class:`~hamidsim.apiserver.store.Store`.

    Use ``async with ApiServer() as server:`` (or ``await start()`` / ``await stop()``), then point
    kubernetes-asyncio at ``server.url``. The Python methods (``put``, ``get``, ``list``, ``patch``,
    ``delete``, token registration, ``faults``) act on the same state and emit the same watch events.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        history_size: int = 10_000,
        bookmark_interval: float = 30.0,
        auto_namespaces: bool = True,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(
            history_size=history_size,
            auto_namespaces=auto_namespaces,
            graceful_pod_deletion=graceful_pod_deletion,
        )
        self.faults = Faults()
        #: Requests served, keyed ``"<verb> <resource>"`` (for example ``"list pods"``).
        self.requests: Counter[str] = Counter()
        self.admission = MutatingAdmission(self.store)
        self.tokens = TokenRegistry()
        #: Python-API aliases of the token registry (tests and the cluster harness register tokens).
        self.register_token = self.tokens.register
        self.register_pod_token = self.tokens.register_pod
        self.revoke_token = self.tokens.revoke
        #: SubjectAccessReview rules (non-resource URLs), registered by tests and the harness.
        self.access = AccessRules()
        self._runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://host:port`` once started."""
        if self._runner is None:
            raise RuntimeError("the API server is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def app(self) -> web.Application:
        """The aiohttp application (one catch-all route)."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", RequestHandler(self).handle)
        return app

    async def start(self) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; ``.port`` then holds it)."""
        if self._runner is not None:
            raise RuntimeError("the API server is already started")
        runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        sockets = runner.addresses
        self.port = int(sockets[0][1])
        self._runner = runner
        self.stopping.clear()
        _log().info("apiserver_started", url=self.url)

    async def stop(self) -> None:
        """End every watch and stop listening."""
        if self._runner is None:
            return
        self.stopping.set()
        self.store.close_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()
        await self.admission.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- Python API -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self.store.rv

    @staticmethod
    def _kind(kind: str, api_version: str | None = None) -> Resource:
        return lookup_kind(kind, api_version)

    @staticmethod
    def _namespace(resource: Resource, namespace: str | None) -> str:
        return (namespace or "default") if resource.namespaced else ""

    @staticmethod
    def _copy(stored: Stored, resource: Resource) -> dict[str, Any]:
        text = dumps(resource.to_view(stored.obj)) if resource.storage else stored.raw()
        copy: dict[str, Any] = json.loads(text)
        return copy

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or overwrite ``obj`` (wire form with ``apiVersion`` and ``kind``), status included.

        No preconditions: for seeding state. Emits ADDED/MODIFIED watch events. Returns the stored copy.
        """
        body = json.loads(dumps(obj))
        return self._copy(self.store.put(body), BY_STORAGE[resource_of(body).store_key])

    def put_many(self, objs: Iterable[Mapping[str, Any]]) -> int:
        """:meth:`put` each object without building return copies (bulk seeding); returns how many."""
        count = 0
        for obj in objs:
            self.store.put(json.loads(dumps(obj)))
            count += 1
        return count

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj`` as a POST would (server defaults, status reset for pods).

        Raises :class:`~hamidsim.apiserver.errors.ApiError` (409 AlreadyExists, 400, 422).
        """
        resource = self._kind(str(obj.get("kind", "")), str(obj.get("apiVersion", "")))
        namespace = self._namespace(resource, objects.namespace(obj))
        stored = self.store.create(resource, namespace, json.loads(dumps(obj)))
        return self._copy(stored, resource)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A copy of one object, or ``None``. ``kind`` is a kind, plural or short name (``Pod``, ``pods``)."""
        resource = self._kind(kind)
        stored = self.store.find(resource, self._namespace(resource, namespace), name)
        return None if stored is None else self._copy(stored, resource)

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Copies of the matching objects (all namespaces when ``namespace`` is ``None``)."""
        resource = self._kind(kind)
        predicate, fields = compile_selectors(
            label_selector, field_selector, resource.fields, resource.plural
        )
        ns = namespace if resource.namespaced else ""
        items, _, _ = self.store.list(resource, ns, predicate, fields)
        return [self._copy(s, resource) for s in items]

    def count(self, kind: str) -> int:
        """Number of stored objects of a kind."""
        return self.store.table(self._kind(kind)).count()

    def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        """Patch an object as a PATCH request would (same preconditions and errors)."""
        resource = self._kind(kind)
        if patch_type not in PATCH_TYPES:
            raise unsupported_patch_type(patch_type)
        stored = self.store.patch(
            resource, self._namespace(resource, namespace), name, patch_type, json.loads(dumps(patch))
        )
        return self._copy(stored, resource)

    def delete(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Delete an object (finalizers honoured); ``None`` when it does not exist."""
        resource = self._kind(kind)
        ns = self._namespace(resource, namespace)
        if self.store.find(resource, ns, name) is None:
            return None
        return self._copy(self.store.delete(resource, ns, name, {"gracePeriodSeconds": 0}), resource)

    def add_listener(self, callback: Callable[[Change], None]) -> Callable[[], None]:
        """Call ``callback(change)`` synchronously after every write; returns a function that removes it.

        ``change.type`` is ADDED/MODIFIED/DELETED, ``change.resource.kind`` the kind and
        ``change.new.obj`` the stored object (read-only: never mutate it).
        """
        self.store.listeners.append(callback)
        return lambda: self.store.listeners.remove(callback) if callback in self.store.listeners else None

    def close_watches(self, kind: str | None = None) -> int:
        """End open watch streams (of one kind, or all) as a dropped connection would; returns how many."""
        return self.store.close_watches(None if kind is None else self._kind(kind))

    def stats(self) -> dict[str, Any]:
        """Current resourceVersion, object and watcher counts, and requests served."""
        return {
            "resourceVersion": self.store.rv,
            "objects": {key: table.count() for key, table in self.store.tables.items()},
            "watchers": {key: len(table.watchers) for key, table in self.store.tables.items()},
            "requests": dict(self.requests),
        }

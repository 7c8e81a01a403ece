"""An in-memory Kubernetes API server over real HTTP, for tests and the demo.

kubernetes-asyncio talks to it unchanged (``Configuration(host=server.url)``). It keeps the
semantics hamid relies on: a global resourceVersion bumped by every write, 409 on stale
preconditions, merge / strategic-merge / JSON patch, list and watch with field and label selectors,
410 for a resourceVersion older than the kept history, ``pods/binding``, core and events.k8s.io
events (one storage, two views), leases, TokenReview for registered tokens, and fault injection.

Differences from a real server, on purpose: no authentication or authorization (every request is
allowed; TokenReview answers only for tokens registered here), no admission beyond pod/namespace
defaults, namespaces are created on first use unless ``auto_namespaces=False``, pods are deleted at
once unless ``graceful_pod_deletion=True``, paginated lists (``limit``/``continue``) read the current
state under the first page's resourceVersion, server-side apply is answered 415.

Admin endpoints (not subject to faults): ``GET|POST|DELETE /_sim/faults``, ``DELETE /_sim/faults/<id>``,
``POST /_sim/watches/close``, ``POST /_sim/tokens``, ``GET /_sim/stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web

from hamid.kube.tokens import NODE_NAME_EXTRA, NODE_UID_EXTRA, POD_NAME_EXTRA, POD_UID_EXTRA
from hamid.log import get_logger
from hamid.sim.apiserver_errors import ApiError, bad_request, status_body
from hamid.sim.apiserver_faults import Faults
from hamid.sim.apiserver_patch import PATCH_TYPES
from hamid.sim.apiserver_resources import (
    BY_PATH,
    BY_STORAGE,
    Resource,
    discovery_api_versions,
    discovery_group,
    discovery_groups,
    discovery_resources,
    lookup_kind,
)
from hamid.sim.apiserver_select import parse_field_selector, parse_label_selector
from hamid.sim.apiserver_store import Change, Store, Stored, Watcher, dumps, resource_of


def _log() -> Any:
    """The module logger, looked up per use so it follows ``hamid.log.configure`` (stderr, format)."""
    return get_logger("sim.apiserver")


VERSION_INFO = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-hamid-sim",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22",
    "compiler": "gc",
    "platform": "linux/amd64",
}
MAX_BODY_BYTES = 16 * 1024 * 1024
TOKEN_REVIEW = "authentication.k8s.io/v1"


@dataclass(frozen=True)
class TokenIdentity:
    """Who a registered bearer token authenticates as (the TokenReview ``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ("system:authenticated",)
    extra: Mapping[str, tuple[str, ...]] | None = None
    #: Audiences the token is valid for; ``None`` accepts any requested audience.
    audiences: tuple[str, ...] | None = None

    def user_json(self) -> dict[str, Any]:
        """``UserInfo`` as a TokenReview status carries it."""
        user: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            user["uid"] = self.uid
        if self.extra:
            user["extra"] = {k: list(v) for k, v in self.extra.items()}
        return user


@dataclass(frozen=True, slots=True)
class _Route:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str
    watch_path: bool


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(body), status=status, content_type="application/json")


def _error_response(err: ApiError) -> web.Response:
    headers = {"Retry-After": "1"} if err.code in (429, 503) else None
    return web.Response(
        body=dumps(err.status), status=err.code, content_type="application/json", headers=headers
    )


def unsupported_patch_type(content_type: str) -> ApiError:
    """415 for a PATCH content type other than merge, strategic merge or JSON patch."""
    accepted = ", ".join(PATCH_TYPES)
    return ApiError(
        415,
        f"the body of the request was in an unknown format ({content_type}); accepted: {accepted}",
    )


def _not_served(path: str) -> ApiError:
    return ApiError(404, f"the server could not find the requested resource ({path})", details={"causes": []})


def _bool_param(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError as err:
        raise bad_request(f"{name} must be an integer, got {value!r}") from err
    if number < 0:
        raise bad_request(f"{name} must not be negative")
    return number


class ApiServer:
    """The embedded API server: an aiohttp app over a :class:`~hamid.sim.apiserver_store.Store`.

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
        self._tokens: dict[str, TokenIdentity] = {}
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

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
        app.router.add_route("*", "/{path:.*}", self._handle)
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
        self._stopping.clear()
        _log().info("apiserver started", url=self.url)

    async def stop(self) -> None:
        """End every watch and stop listening."""
        if self._runner is None:
            return
        self._stopping.set()
        self.store.close_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()

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
        if resource.storage:
            return json.loads(dumps(resource.to_view(stored.obj)))
        return json.loads(stored.raw())

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

        Raises :class:`~hamid.sim.apiserver_errors.ApiError` (409 AlreadyExists, 400, 422).
        """
        resource = self._kind(str(obj.get("kind", "")), str(obj.get("apiVersion", "")))
        namespace = self._namespace(resource, (obj.get("metadata") or {}).get("namespace"))
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
        predicate, fields = self._selectors(resource, label_selector, field_selector)
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

    def register_token(
        self,
        token: str,
        username: str,
        *,
        uid: str = "",
        groups: Sequence[str] = ("system:authenticated",),
        extra: Mapping[str, str | Sequence[str]] | None = None,
        audiences: Sequence[str] | None = None,
    ) -> TokenIdentity:
        """Make TokenReview authenticate ``token`` as this user (``extra`` values: a string or a list)."""
        if not token:
            raise ValueError("a token must not be empty")
        normalized = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in (extra or {}).items()}
        identity = TokenIdentity(
            username,
            uid,
            tuple(groups),
            normalized or None,
            tuple(audiences) if audiences is not None else None,
        )
        self._tokens[token] = identity
        return identity

    def register_pod_token(
        self,
        token: str,
        *,
        namespace: str,
        pod_name: str,
        pod_uid: str,
        service_account: str = "default",
        service_account_uid: str = "",
        node_name: str | None = None,
        node_uid: str | None = None,
        audiences: Sequence[str] | None = None,
    ) -> TokenIdentity:
        """Register a projected service-account token bound to a pod, as the real server reports it."""
        extra: dict[str, str] = {POD_NAME_EXTRA: pod_name, POD_UID_EXTRA: pod_uid}
        if node_name:
            extra[NODE_NAME_EXTRA] = node_name
        if node_uid:
            extra[NODE_UID_EXTRA] = node_uid
        return self.register_token(
            token,
            f"system:serviceaccount:{namespace}:{service_account}",
            uid=service_account_uid,
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
            extra=extra,
            audiences=audiences,
        )

    def revoke_token(self, token: str) -> None:
        """Forget a token (TokenReview then answers ``authenticated: false``)."""
        self._tokens.pop(token, None)

    # --- HTTP -------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        try:
            if path.startswith("/_sim/"):
                return await self._admin(request)
            return await self._serve(request)
        except ApiError as err:
            return _error_response(err)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return _error_response(bad_request(f"the request body is not valid JSON: {err}"))
        except web.HTTPRequestEntityTooLarge:
            return _error_response(ApiError(413, "the request body is too large"))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as err:
            _log().exception("apiserver request failed", method=request.method, path=path)
            return _error_response(ApiError(500, f"internal error: {type(err).__name__}: {err}"))

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        segments = [s for s in path.split("/") if s]
        if request.method == "GET":
            simple = self._discovery(segments)
            if simple is not None:
                await self.faults.before("get", "GET", path)
                return simple
        route = self._route(segments, path)
        verb = self._verb(request, route)
        self.requests[f"{verb} {route.resource.plural}"] += 1
        await self.faults.before(verb, request.method, path)
        if "dryRun" in request.query:
            raise bad_request("dryRun is not supported by the embedded API server")
        if route.resource.plural == "tokenreviews":
            self._check_verb_allowed(route, verb)
            return self._token_review(await self._body(request))
        if route.resource.plural == "bindings" or route.subresource == "binding":
            return await self._bind(request, route)
        if verb in ("list", "watch"):
            return await self._list_or_watch(request, route, verb)
        if verb == "deletecollection":
            return await self._delete_collection(request, route)
        return await self._object_verb(request, route, verb)

    def _discovery(self, segments: list[str]) -> web.StreamResponse | None:
        if segments in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if segments == ["version"]:
            return _json_response(VERSION_INFO)
        if segments == ["api"]:
            return _json_response(discovery_api_versions(f"{self.host}:{self.port}"))
        if segments == ["apis"]:
            return _json_response(discovery_groups())
        body: dict[str, Any] | None = None
        if segments == ["api", "v1"]:
            body = discovery_resources("v1")
        elif len(segments) == 2 and segments[0] == "apis":
            body = discovery_group(segments[1])
        elif len(segments) == 3 and segments[0] == "apis":
            body = discovery_resources(f"{segments[1]}/{segments[2]}")
        else:
            return None
        if body is None:
            raise _not_served("/" + "/".join(segments))
        return _json_response(body)

    def _route(self, segments: list[str], path: str) -> _Route:
        if len(segments) >= 2 and segments[0] == "api" and segments[1] == "v1":
            api_version, rest = "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            api_version, rest = f"{segments[1]}/{segments[2]}", segments[3:]
        else:
            raise _not_served(path)
        watch_path = bool(rest) and rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        if not rest:
            raise _not_served(path)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = BY_PATH.get((api_version, rest[2]))
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        resource = BY_PATH.get((api_version, rest[0]))
        if resource is None or len(rest) > 3:
            raise _not_served(path)
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and subresource not in resource.subresources:
            raise _not_served(path)
        if resource.namespaced and namespace is None and name is not None:
            raise _not_served(path)
        if not resource.namespaced:
            namespace = ""
        return _Route(resource, namespace, name, subresource, watch_path)

    @staticmethod
    def _verb(request: web.Request, route: _Route) -> str:
        method = request.method
        if method == "GET":
            if route.name is None:
                watch = route.watch_path or _bool_param(request.query.get("watch"))
                return "watch" if watch else "list"
            return "watch" if route.watch_path else "get"
        verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
        if method in verbs:
            return verbs[method]
        if method == "DELETE":
            return "delete" if route.name is not None else "deletecollection"
        raise ApiError(405, f"the server does not allow this method on the requested resource ({method})")

    async def _body(self, request: web.Request, *, allow_empty: bool = False) -> Any:
        content_type = request.content_type
        if "protobuf" in content_type or "yaml" in content_type:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - {content_type}; use application/json",
            )
        raw = await request.read()
        if not raw.strip():
            if allow_empty:
                return None
            raise bad_request("the request has no body")
        return json.loads(raw)

    def _check_verb_allowed(self, route: _Route, verb: str) -> None:
        if route.subresource == "status" and verb not in ("get", "update", "patch"):
            raise ApiError(405, f"{verb} is not supported on {route.resource.plural}/status")
        if verb not in route.resource.verbs:
            raise ApiError(405, f"{verb} is not supported on {route.resource.plural}")

    async def _object_verb(self, request: web.Request, route: _Route, verb: str) -> web.StreamResponse:
        self._check_verb_allowed(route, verb)
        resource, namespace = route.resource, route.namespace or ""
        store = self.store
        if verb == "create":
            if route.name is not None:
                raise ApiError(405, "POST is only allowed on a collection")
            if namespace == "" and resource.namespaced:
                raise _not_served(request.path)
            stored = store.create(resource, namespace, await self._body(request))
            return self._object_response(stored, resource, 201)
        name = route.name or ""
        if verb == "get":
            return self._object_response(store.get(resource, namespace, name), resource)
        if verb == "update":
            stored = store.replace(resource, namespace, name, await self._body(request), route.subresource)
            return self._object_response(stored, resource)
        if verb == "patch":
            content_type = request.content_type
            if content_type not in PATCH_TYPES:
                raise unsupported_patch_type(content_type)
            stored = store.patch(
                resource, namespace, name, content_type, await self._body(request), route.subresource
            )
            return self._object_response(stored, resource)
        options = await self._delete_options(request)
        return self._object_response(store.delete(resource, namespace, name, options), resource)

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        body = await self._body(request, allow_empty=True)
        options = body if isinstance(body, dict) else {}
        if body is not None and not isinstance(body, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        grace = _int_param(request.query, "gracePeriodSeconds")
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        return options

    async def _delete_collection(self, request: web.Request, route: _Route) -> web.StreamResponse:
        self._check_verb_allowed(route, "deletecollection")
        resource = route.resource
        predicate, fields = self._selectors(
            resource, request.query.get("labelSelector"), request.query.get("fieldSelector")
        )
        options = await self._delete_options(request)
        items, rv, _ = self.store.list(resource, route.namespace, predicate, fields)
        deleted = [self.store.delete(resource, s.namespace, s.name, options) for s in items]
        return web.Response(
            body=self._list_bytes(resource, deleted, rv, None), status=200, content_type="application/json"
        )

    def _object_response(self, stored: Stored, resource: Resource, status: int = 200) -> web.Response:
        raw = stored.raw() if not resource.storage else dumps(resource.to_view(stored.obj))
        return web.Response(body=raw, status=status, content_type="application/json")

    @staticmethod
    def _selectors(
        resource: Resource, label_selector: str | None, field_selector: str | None
    ) -> tuple[Callable[[dict[str, Any]], bool] | None, Any]:
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, resource.fields, resource.plural)
        field_test = fields.compile(resource.fields) if fields is not None else None
        if labels is None and field_test is None:
            return None, fields
        if labels is None:
            return field_test, fields
        label_test = labels
        if field_test is None:
            return lambda obj: label_test(obj["metadata"].get("labels") or {}), fields
        return lambda obj: label_test(obj["metadata"].get("labels") or {}) and field_test(obj), fields

    @staticmethod
    def _list_bytes(resource: Resource, items: list[Stored], rv: int, token: str | None) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            meta["continue"] = token
        if resource.storage:
            raws = [dumps(resource.to_view(s.obj)) for s in items]
        else:
            raws = [s.raw() for s in items]
        head = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": meta}
        return dumps(head)[:-1] + b',"items":[' + b",".join(raws) + b"]}"

    async def _list_or_watch(self, request: web.Request, route: _Route, verb: str) -> web.StreamResponse:
        self._check_verb_allowed(route, verb)
        query = request.query
        resource = route.resource
        predicate, fields = self._selectors(resource, query.get("labelSelector"), query.get("fieldSelector"))
        if verb == "list":
            limit = _int_param(query, "limit")
            items, rv, token = self.store.list(
                resource, route.namespace, predicate, fields, limit or None, query.get("continue") or None
            )
            body = self._list_bytes(resource, items, rv, token)
            return web.Response(body=body, content_type="application/json")
        timeout = _int_param(query, "timeoutSeconds")
        bookmarks = _bool_param(query.get("allowWatchBookmarks"))
        initial = _bool_param(query.get("sendInitialEvents"))
        namespace = route.namespace
        if route.name is not None:
            name = route.name
            base = predicate
            predicate = (
                (lambda obj: obj["metadata"]["name"] == name and base(obj))
                if base
                else (lambda obj: obj["metadata"]["name"] == name)
            )
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            watcher = self.store.watch(
                resource, namespace, predicate, query.get("resourceVersion"), initial_events=initial
            )
        except ApiError as err:
            if err.code != 410:
                raise
            await response.prepare(request)
            await response.write(dumps({"type": "ERROR", "object": err.status}) + b"\n")
            await response.write_eof()
            return response
        initial_count = len(watcher.pending) if initial else -1
        snapshot_rv = self.store.rv
        try:
            await response.prepare(request)
            await self._stream(response, watcher, timeout, bookmarks, initial_count, snapshot_rv)
        except (ConnectionResetError, ConnectionError):
            return response
        finally:
            self.store.unwatch(watcher)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _bookmark(self, resource: Resource, rv: int, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        event = {
            "type": "BOOKMARK",
            "object": {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": meta},
        }
        return dumps(event) + b"\n"

    async def _stream(
        self,
        response: web.StreamResponse,
        watcher: Watcher,
        timeout_seconds: int | None,
        bookmarks: bool,
        initial_count: int,
        snapshot_rv: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds if timeout_seconds else None
        next_bookmark = loop.time() + self.bookmark_interval
        sent = 0
        if initial_count == 0:
            await response.write(self._bookmark(watcher.resource, snapshot_rv, initial_end=True))
            initial_count = -1
        while True:
            watcher.wake.clear()
            if watcher.pending:
                batch: list[bytes] = []
                while watcher.pending and len(batch) < 1000:
                    kind, stored = watcher.pending.popleft()
                    batch.append(watcher.encode(kind, stored))
                    sent += 1
                    if sent == initial_count:
                        batch.append(self._bookmark(watcher.resource, snapshot_rv, initial_end=True))
                        initial_count = -1
                await response.write(b"".join(batch))
                continue
            if watcher.closed or self._stopping.is_set():
                return
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if bookmarks and now >= next_bookmark:
                await response.write(self._bookmark(watcher.resource, self.store.rv))
                next_bookmark = now + self.bookmark_interval
                continue
            waits = [next_bookmark - now] if bookmarks else []
            if deadline is not None:
                waits.append(deadline - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watcher.wake.wait(), min(waits) if waits else None)

    async def _bind(self, request: web.Request, route: _Route) -> web.StreamResponse:
        if request.method != "POST":
            raise ApiError(405, "bindings only support create (POST)")
        if not route.namespace:
            raise _not_served(request.path)
        body = await self._body(request)
        self.store.bind(route.namespace, body, route.name if route.subresource == "binding" else None)
        return _json_response(status_body(201, ""), 201)

    def _token_review(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise bad_request("a TokenReview needs a spec")
        spec = body["spec"]
        token = spec.get("token")
        wanted = spec.get("audiences") or []
        if not isinstance(token, str) or not token:
            raise ApiError(422, 'TokenReview.authentication.k8s.io "" is invalid: spec.token: Required value')
        if not isinstance(wanted, list) or not all(isinstance(a, str) for a in wanted):
            raise bad_request("spec.audiences must be a list of strings")
        identity = self._tokens.get(token)
        status: dict[str, Any]
        if identity is None:
            status = {"authenticated": False, "user": {}, "error": "invalid bearer token"}
        else:
            audiences = list(identity.audiences) if identity.audiences is not None else list(wanted)
            if wanted and identity.audiences is not None:
                audiences = [a for a in wanted if a in identity.audiences]
            if wanted and not audiences:
                status = {
                    "authenticated": False,
                    "user": {},
                    "error": f"token audiences {list(identity.audiences or [])} is invalid "
                    f"for the target audiences {wanted}",
                }
            else:
                status = {"authenticated": True, "user": identity.user_json(), "audiences": audiences}
        review = {
            "kind": "TokenReview",
            "apiVersion": TOKEN_REVIEW,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return _json_response(review, 201)

    # --- admin endpoints --------------------------------------------------------------------------

    async def _admin(self, request: web.Request) -> web.StreamResponse:
        segments = [s for s in request.path.split("/") if s][1:]
        method = request.method
        if segments == ["faults"]:
            if method == "GET":
                return _json_response({"rules": [r.to_json() for r in self.faults.rules]})
            if method == "POST":
                rule = self.faults.add_from_json(await self._body(request))
                return _json_response(rule.to_json(), 201)
            if method == "DELETE":
                self.faults.clear()
                return _json_response({"rules": []})
        if len(segments) == 2 and segments[0] == "faults" and method == "DELETE":
            if not segments[1].isdigit() or not self.faults.remove(int(segments[1])):
                raise ApiError(404, f"no fault rule {segments[1]!r}")
            return _json_response({"removed": int(segments[1])})
        if segments == ["watches", "close"] and method == "POST":
            body = await self._body(request, allow_empty=True)
            kind = body.get("kind") if isinstance(body, dict) else None
            return _json_response({"closed": self._admin_close(kind)})
        if segments == ["tokens"] and method == "POST":
            return _json_response(self._admin_token(await self._body(request)), 201)
        if segments == ["stats"] and method == "GET":
            return _json_response(self.stats())
        raise ApiError(404, f"unknown admin endpoint {method} {request.path}")

    def _admin_close(self, kind: Any) -> int:
        if kind is not None and not isinstance(kind, str):
            raise bad_request("kind must be a string")
        try:
            return self.close_watches(kind)
        except KeyError as err:
            raise bad_request(str(err)) from err

    def _admin_token(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("a token registration must be a JSON object")
        token, username = body.get("token"), body.get("username")
        groups = body.get("groups", ["system:authenticated"])
        extra = body.get("extra") or {}
        audiences = body.get("audiences")
        if not isinstance(token, str) or not token or not isinstance(username, str) or not username:
            raise bad_request("a token registration needs non-empty token and username strings")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise bad_request("groups must be a list of strings")
        if not isinstance(extra, dict) or not all(
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, str) for i in v))
            for v in extra.values()
        ):
            raise bad_request("extra must map strings to a string or a list of strings")
        if audiences is not None and (
            not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences)
        ):
            raise bad_request("audiences must be a list of strings")
        identity = self.register_token(
            token, username, uid=str(body.get("uid") or ""), groups=groups, extra=extra, audiences=audiences
        )
        return {"username": identity.username, "registered": True}

    def stats(self) -> dict[str, Any]:
        """Current resourceVersion, object and watcher counts, and requests served."""
        return {
            "resourceVersion": self.store.rv,
            "objects": {key: table.count() for key, table in self.store.tables.items()},
            "watchers": {key: len(table.watchers) for key, table in self.store.tables.items()},
            "requests": dict(self.requests),
        }

"""The embedded API server's HTTP side: routing, verbs, list and watch streams, admin endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from hamid.log import get_logger
from hamidsim.apiserver import openapi, protobuf, tables, validation
from hamidsim.apiserver.access import AccessRules
from hamidsim.apiserver.admission import MutatingAdmission
from hamidsim.apiserver.errors import STALE, ApiError, bad_request, conflict, status_body
from hamidsim.apiserver.faults import Faults
from hamidsim.apiserver.patch import PATCH_TYPES
from hamidsim.apiserver.resources import (
    BY_PATH,
    Resource,
    discovery_api_versions,
    discovery_group,
    discovery_groups,
    discovery_resources,
)
from hamidsim.apiserver.select import compile_selectors
from hamidsim.apiserver.store import Store, Stored, Watcher, dumps
from hamidsim.apiserver.tokens import TokenRegistry


def _table_event_encoder(resource: Resource, include: str) -> Callable[[str, Stored], bytes]:
    """Watch events whose object is a one-row Table (``kubectl get -w``)."""

    def encode(kind: str, stored: Stored) -> bytes:
        view = resource.to_view(stored.obj)
        row = tables.table(resource.plural, [view], {"resourceVersion": str(stored.rv)}, include)
        return dumps({"type": kind, "object": row}) + b"\n"

    return encode


class ServedState(Protocol):
    """What the handler serves: the :class:`~hamidsim.apiserver.server.ApiServer`'s parts."""

    host: str
    port: int
    bookmark_interval: float
    store: Store
    faults: Faults
    tokens: TokenRegistry
    access: AccessRules
    admission: MutatingAdmission
    requests: Counter[str]
    stopping: asyncio.Event

    def close_watches(self, kind: str | None = None) -> int:
        """End open watch streams; returns how many."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counts for the admin endpoint."""
        ...


def _log() -> Any:
    """The module logger, looked up per use so it follows ``hamid.log.configure`` (stderr, format)."""
    return get_logger("sim.apiserver")


VERSION_INFO = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-hamid-sim",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2025-12-17T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}
MAX_BODY_BYTES = 16 * 1024 * 1024
#: How often an admitted update is retried when the object changed while the webhooks answered.
_UPDATE_ATTEMPTS = 5


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


def _openapi(rest: list[str], accept: str) -> web.Response:
    """``/openapi/v2`` (JSON only: a protobuf-only Accept is 406) and ``/openapi/v3[/<group version>]``."""
    if rest == ["v2"]:
        kinds = [part.split(";")[0].strip() for part in accept.split(",") if part.strip()]
        if kinds and not any(k in ("application/json", "*/*", "application/*") for k in kinds):
            raise ApiError(406, f"only application/json is served for /openapi/v2, not {accept}")
        return web.Response(body=openapi.v2_document(), content_type="application/json")
    if rest == ["v3"]:
        return _json_response(openapi.v3_index())
    document = openapi.v3_document("/".join(rest[1:])) if rest[:1] == ["v3"] else None
    if document is None:
        raise _not_served("/openapi/" + "/".join(rest))
    return web.Response(body=document, content_type="application/json")


class RequestHandler:
    """Serves one :class:`~hamidsim.apiserver.server.ApiServer`'s state over HTTP (one catch-all route)."""

    def __init__(self, server: ServedState) -> None:
        self.server = server

    async def handle(self, request: web.Request) -> web.StreamResponse:
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
            _log().exception("apiserver_request_failed", method=request.method, path=path)
            return _error_response(ApiError(500, f"internal error: {type(err).__name__}: {err}"))

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self._user(request)  # an unknown bearer token is a 401 for every request
        segments = [s for s in path.split("/") if s]
        if request.method == "GET":
            simple = self._discovery(segments, request.headers.get("Accept", ""))
            if simple is not None:
                await self.server.faults.before("get", "GET", path)
                return simple
        route = self._route(segments, path)
        verb = self._verb(request, route)
        self.server.requests[f"{verb} {route.resource.plural}"] += 1
        await self.server.faults.before(verb, request.method, path)
        if "dryRun" in request.query:
            raise bad_request("dryRun is not supported by the embedded API server")
        if route.resource.plural == "tokenreviews":
            self._check_verb_allowed(route, verb)
            return _json_response(self.server.tokens.review(await self._body(request)), 201)
        if route.resource.plural == "subjectaccessreviews":
            self._check_verb_allowed(route, verb)
            return _json_response(self.server.access.review(await self._body(request)), 201)
        if route.resource.plural == "bindings" or route.subresource == "binding":
            return await self._bind(request, route)
        if verb in ("list", "watch"):
            return await self._list_or_watch(request, route, verb)
        if verb == "deletecollection":
            return await self._delete_collection(request, route)
        return await self._object_verb(request, route, verb)

    def _discovery(self, segments: list[str], accept: str) -> web.StreamResponse | None:
        if segments in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if segments == ["version"]:
            return _json_response(VERSION_INFO)
        if segments == ["api"]:
            return _json_response(discovery_api_versions(f"{self.server.host}:{self.server.port}"))
        if segments == ["apis"]:
            return _json_response(discovery_groups())
        if segments[:1] == ["openapi"]:
            return _openapi(segments[1:], accept)
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

    async def _body(self, request: web.Request, *, allow_empty: bool = False, objects: bool = False) -> Any:
        """The request body as JSON; protobuf is read for the kinds :mod:`.protobuf` knows (``objects``)."""
        content_type = request.content_type
        raw = await request.read()
        if content_type == protobuf.MEDIA_TYPE and objects:
            return protobuf.decode_object(raw)
        if "protobuf" in content_type or "yaml" in content_type:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - {content_type}; use application/json",
            )
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
        store = self.server.store
        mode = validation.directive(request.query.get("fieldValidation"))
        warnings: list[str] = []
        if verb == "create":
            if route.name is not None:
                raise ApiError(405, "POST is only allowed on a collection")
            if namespace == "" and resource.namespaced:
                raise _not_served(request.path)
            body = await self._body(request, objects=True)
            warnings = validation.check_fields(resource, body, mode)
            body = await self.server.admission.admit(resource, namespace, body, self._user(request))
            stored = store.create(resource, namespace, body)
            return self._object_response(request, stored, resource, 201, warnings)
        name = route.name or ""
        if verb == "get":
            return self._object_response(request, store.get(resource, namespace, name), resource)
        if verb == "update":
            body = await self._body(request, objects=True)
            warnings = validation.check_fields(resource, body, mode)
            stored = await self._admitted_update(request, route, lambda _old: store.incoming(resource, body))
            return self._object_response(request, stored, resource, 200, warnings)
        if verb == "patch":
            content_type = request.content_type
            if content_type not in PATCH_TYPES:
                raise unsupported_patch_type(content_type)

            def check(patched: dict[str, Any]) -> None:
                warnings.extend(validation.check_fields(resource, patched, mode))

            patch = await self._body(request)
            stored = await self._admitted_update(
                request, route, lambda old: store.patched(resource, old, content_type, patch, check)
            )
            return self._object_response(request, stored, resource, 200, warnings)
        options = await self._delete_options(request)
        return self._object_response(request, store.delete(resource, namespace, name, options), resource)

    def _user(self, request: web.Request) -> dict[str, Any]:
        """The caller's ``userInfo`` (401 for an unknown token)."""
        return self.server.tokens.authenticate(request.headers.get("Authorization"))

    async def _admitted_update(
        self, request: web.Request, route: _Route, change: Callable[[Stored], dict[str, Any]]
    ) -> Stored:
        """PUT or PATCH ``route``'s object to ``change(stored)``, through the UPDATE webhooks.

        Without an UPDATE webhook this is one synchronous store update. With one, the webhooks
        judge the new object beside the stored one; if the store changed during their answer,
        the update is made and judged again from the new version (a real server's retry).
        """
        store, admission = self.server.store, self.server.admission
        resource, namespace, name = route.resource, route.namespace or "", route.name or ""
        user = self._user(request)
        for _ in range(_UPDATE_ATTEMPTS):
            old = store.get(resource, namespace, name)
            new = store.prepare_update(resource, old, change(old), route.subresource)
            if new is None:
                return old
            if admission.wants_update(resource, route.subresource):
                admitted = await admission.admit(resource, namespace, new, user, old.obj, route.subresource)
                if store.find(resource, namespace, name) is not old:
                    continue
                if admitted is not new:  # a webhook patched it: checked as the store checks any update
                    new = store.prepare_update(resource, old, admitted, route.subresource)
                    if new is None:
                        return old
            return store.commit_update(resource, old, new)
        raise conflict(resource.plural, name, STALE, resource.group)

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
        predicate, fields = compile_selectors(
            request.query.get("labelSelector"),
            request.query.get("fieldSelector"),
            resource.fields,
            resource.plural,
        )
        options = await self._delete_options(request)
        items, rv, _ = self.server.store.list(resource, route.namespace, predicate, fields)
        deleted = [self.server.store.delete(resource, s.namespace, s.name, options) for s in items]
        return web.Response(
            body=self._list_bytes(resource, deleted, rv, None), status=200, content_type="application/json"
        )

    @staticmethod
    def _object_response(
        request: web.Request,
        stored: Stored,
        resource: Resource,
        status: int = 200,
        warnings: Sequence[str] = (),
    ) -> web.Response:
        if tables.wants_table(request.headers.get("Accept", "")):
            view = resource.to_view(stored.obj)
            include = request.query.get("includeObject", "Metadata")
            raw = dumps(tables.table(resource.plural, [view], {"resourceVersion": str(stored.rv)}, include))
        else:
            raw = stored.raw() if not resource.storage else dumps(resource.to_view(stored.obj))
        headers = [("Warning", '299 - "' + w.replace('"', '\\"') + '"') for w in warnings]
        return web.Response(body=raw, status=status, content_type="application/json", headers=headers or None)

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
        predicate, fields = compile_selectors(
            query.get("labelSelector"), query.get("fieldSelector"), resource.fields, resource.plural
        )
        if verb == "list":
            limit = _int_param(query, "limit")
            items, rv, token = self.server.store.list(
                resource, route.namespace, predicate, fields, limit or None, query.get("continue") or None
            )
            if tables.wants_table(request.headers.get("Accept", "")):
                meta = {"resourceVersion": str(rv), **({"continue": token} if token else {})}
                views = [resource.to_view(s.obj) for s in items]
                include = query.get("includeObject", "Metadata")
                return _json_response(tables.table(resource.plural, views, meta, include))
            body = self._list_bytes(resource, items, rv, token)
            return web.Response(body=body, content_type="application/json")
        return await self._watch(request, route, predicate)

    async def _watch(
        self, request: web.Request, route: _Route, predicate: Callable[[dict[str, Any]], bool] | None
    ) -> web.StreamResponse:
        """A watch stream: events (as Tables when asked), bookmarks, a 410 as an ERROR event."""
        query = request.query
        resource = route.resource
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
            watcher = self.server.store.watch(
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
        snapshot_rv = self.server.store.rv
        try:
            await response.prepare(request)
            encode: Callable[[str, Stored], bytes] = watcher.encode
            if tables.wants_table(request.headers.get("Accept", "")):
                encode = _table_event_encoder(resource, query.get("includeObject", "Metadata"))
            await self._stream(response, watcher, encode, timeout, bookmarks, initial_count, snapshot_rv)
        except (ConnectionResetError, ConnectionError):
            return response
        finally:
            self.server.store.unwatch(watcher)
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
        encode: Callable[[str, Stored], bytes],
        timeout_seconds: int | None,
        bookmarks: bool,
        initial_count: int,
        snapshot_rv: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds if timeout_seconds else None
        next_bookmark = loop.time() + self.server.bookmark_interval
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
                    batch.append(encode(kind, stored))
                    sent += 1
                    if sent == initial_count:
                        batch.append(self._bookmark(watcher.resource, snapshot_rv, initial_end=True))
                        initial_count = -1
                await response.write(b"".join(batch))
                continue
            if watcher.closed or self.server.stopping.is_set():
                return
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if bookmarks and now >= next_bookmark:
                await response.write(self._bookmark(watcher.resource, self.server.store.rv))
                next_bookmark = now + self.server.bookmark_interval
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
        self.server.store.bind(route.namespace, body, route.name if route.subresource == "binding" else None)
        return _json_response(status_body(201, ""), 201)

    async def _admin(self, request: web.Request) -> web.StreamResponse:
        segments = [s for s in request.path.split("/") if s][1:]
        method = request.method
        if segments == ["faults"]:
            if method == "GET":
                return _json_response({"rules": [r.to_json() for r in self.server.faults.rules]})
            if method == "POST":
                rule = self.server.faults.add_from_json(await self._body(request))
                return _json_response(rule.to_json(), 201)
            if method == "DELETE":
                self.server.faults.clear()
                return _json_response({"rules": []})
        if len(segments) == 2 and segments[0] == "faults" and method == "DELETE":
            number = segments[1]
            if not (number.isascii() and number.isdigit()) or not self.server.faults.remove(int(number)):
                raise ApiError(404, f"no fault rule {segments[1]!r}")
            return _json_response({"removed": int(segments[1])})
        if segments == ["watches", "close"] and method == "POST":
            body = await self._body(request, allow_empty=True)
            kind = body.get("kind") if isinstance(body, dict) else None
            return _json_response({"closed": self._admin_close(kind)})
        if segments == ["tokens"] and method == "POST":
            return _json_response(self._admin_token(await self._body(request)), 201)
        if segments == ["stats"] and method == "GET":
            return _json_response(self.server.stats())
        raise ApiError(404, f"unknown admin endpoint {method} {request.path}")

    def _admin_close(self, kind: Any) -> int:
        if kind is not None and not isinstance(kind, str):
            raise bad_request("kind must be a string")
        try:
            return self.server.close_watches(kind)
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
        identity = self.server.tokens.register(
            token, username, uid=str(body.get("uid") or ""), groups=groups, extra=extra, audiences=audiences
        )
        return {"username": identity.username, "registered": True}

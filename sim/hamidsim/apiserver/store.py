"""In-memory storage of the embedded API server: objects, indexes, the write path and watch fan-out.

Every write goes through :meth:`Store.commit`, which bumps the one global resourceVersion, updates
the indexes, appends to the resource's bounded history and hands the change to each watcher of that
resource. Stored objects are never mutated after commit (writes build new dicts that may share
unchanged subtrees), so each version is serialized at most once (:meth:`Stored.raw`).

Watch selection follows the real server: a watcher with a selector sees ADDED when an object starts
matching, MODIFIED while it keeps matching, and DELETED (carrying the new state) when it stops.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import json
import re
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hamid.model import objects
from hamidsim.apiserver.defaults import apply_create_defaults, quantities_as_text
from hamidsim.apiserver.errors import (
    STALE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    gone,
    invalid,
    not_found,
)
from hamidsim.apiserver.patch import PatchError, apply_patch
from hamidsim.apiserver.resources import BY_STORAGE, RESOURCES, Resource
from hamidsim.apiserver.select import FieldSelector

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IMMUTABLE_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "name")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

Predicate = Callable[[dict[str, Any]], bool]
WriteListener = Callable[["Change"], None]


def now_rfc3339(offset_seconds: float = 0) -> str:
    """Current UTC time in the API's second-precision RFC 3339 form."""
    return (datetime.now(UTC) + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(obj, separators=(",", ":")).encode()


class Stored:
    """One committed version of an object (storage form) with its JSON cached on first use."""

    __slots__ = ("_raw", "obj", "rv")

    def __init__(self, obj: dict[str, Any], rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self._raw: bytes | None = None

    def raw(self) -> bytes:
        """The object's JSON, serialized once."""
        if self._raw is None:
            self._raw = dumps(self.obj)
        return self._raw

    @property
    def namespace(self) -> str:
        """``metadata.namespace`` (empty for cluster-scoped objects)."""
        return str(self.obj["metadata"].get("namespace", ""))

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return str(self.obj["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class Change:
    """One committed write: ``type`` is ADDED, MODIFIED or DELETED; ``new`` is the state after it."""

    rv: int
    type: str
    resource: Resource
    old: Stored | None
    new: Stored


def _transition(old_match: bool, new_match: bool) -> str:
    """The event a selective watcher sees for a MODIFIED object (empty: none)."""
    if new_match:
        return "MODIFIED" if old_match else "ADDED"
    return "DELETED" if old_match else ""


class Watcher:
    """One open watch: its filters and the events queued for its stream."""

    def __init__(
        self,
        resource: Resource,
        namespace: str | None,
        predicate: Predicate | None,
        max_pending: int,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self.predicate = predicate
        self.max_pending = max_pending
        self.pending: deque[tuple[str, Stored]] = deque()
        self.wake = asyncio.Event()
        self.closed = False

    def matches(self, stored: Stored) -> bool:
        """Whether an object version is in this watcher's selection."""
        if self.namespace is not None and stored.namespace != self.namespace:
            return False
        if self.predicate is None:
            return True
        return self.predicate(self.resource.to_view(stored.obj))

    def offer(self, change: Change) -> None:
        """Queue what this watcher should see of a change (possibly nothing)."""
        new_match = self.matches(change.new)
        if change.type == "ADDED":
            kind = "ADDED" if new_match else ""
        elif change.type == "DELETED":
            kind = "DELETED" if new_match else ""
        else:
            old_match = change.old is not None and self.matches(change.old)
            kind = _transition(old_match, new_match)
        if kind:
            self.push(kind, change.new)

    def push(self, kind: str, stored: Stored) -> None:
        """Queue one event; a watcher that falls too far behind is closed (its client resumes)."""
        if self.closed:
            return
        if len(self.pending) >= self.max_pending:
            self.close()
            return
        self.pending.append((kind, stored))
        self.wake.set()

    def close(self) -> None:
        """End the stream after what is queued."""
        self.closed = True
        self.wake.set()

    def encode(self, kind: str, stored: Stored) -> bytes:
        """One watch event line."""
        raw = stored.raw() if self.resource.storage == "" else dumps(self.resource.to_view(stored.obj))
        return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


@dataclass
class Table:
    """All objects of one storage key, their indexes, history and watchers."""

    resource: Resource
    history_size: int
    objects: dict[str, dict[str, Stored]] = field(default_factory=dict)
    by_node: dict[str, dict[tuple[str, str], Stored]] | None = None
    history: list[Change] = field(default_factory=list)
    #: Oldest resourceVersion a watch may start from (events after it are all in ``history``).
    floor: int = 0
    watchers: set[Watcher] = field(default_factory=set)

    def count(self) -> int:
        """Number of stored objects."""
        return sum(len(names) for names in self.objects.values())

    def all(self) -> Iterator[Stored]:
        """Every stored object."""
        for names in self.objects.values():
            yield from names.values()

    def record(self, change: Change) -> None:
        """Append to the bounded history."""
        self.history.append(change)
        if len(self.history) > 2 * self.history_size:
            cut = len(self.history) - self.history_size
            self.floor = self.history[cut - 1].rv
            del self.history[:cut]

    def since(self, rv: int) -> list[Change]:
        """History entries after ``rv`` (which must be >= ``floor``)."""
        start = bisect.bisect_right(self.history, rv, key=lambda change: change.rv)
        return self.history[start:]


def _node_of(obj: dict[str, Any]) -> str:
    spec = obj.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


def _parse_rv(value: str, what: str = "resourceVersion") -> int:
    if not (value.isascii() and value.isdigit()):
        raise bad_request(f"invalid {what}: {value!r}")
    return int(value)


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class Store:
    """All tables plus the global resourceVersion and write listeners."""

    def __init__(
        self,
        *,
        history_size: int = 10_000,
        max_watch_pending: int = 1_000_000,
        auto_namespaces: bool = True,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.rv = 0
        self.max_watch_pending = max_watch_pending
        self.auto_namespaces = auto_namespaces
        self.graceful_pod_deletion = graceful_pod_deletion
        self.tables: dict[str, Table] = {
            key: Table(resource, history_size, by_node={} if key == "pods" else None)
            for key, resource in BY_STORAGE.items()
        }
        self.listeners: list[WriteListener] = []
        namespaces = BY_STORAGE["namespaces"]
        for name in DEFAULT_NAMESPACES:
            self.create(namespaces, "", {"metadata": {"name": name}})

    def table(self, resource: Resource) -> Table:
        """The table behind a resource (views share their base's)."""
        return self.tables[resource.store_key]

    # --- commit -----------------------------------------------------------------------------------

    def commit(self, resource: Resource, kind: str, old: Stored | None, obj: dict[str, Any]) -> Stored:
        """Record a write of ``obj`` (storage form): bump the resourceVersion, index, notify."""
        table = self.tables[resource.store_key]
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        new = Stored(obj, self.rv)
        ns, name = new.namespace, new.name
        if kind == "DELETED":
            names = table.objects.get(ns)
            if names is not None:
                names.pop(name, None)
                if not names:
                    del table.objects[ns]
        else:
            table.objects.setdefault(ns, {})[name] = new
        if table.by_node is not None:
            if old is not None:
                bucket = table.by_node.get(_node_of(old.obj))
                if bucket is not None:
                    bucket.pop((ns, name), None)
                    if not bucket:
                        del table.by_node[_node_of(old.obj)]
            if kind != "DELETED":
                table.by_node.setdefault(_node_of(obj), {})[(ns, name)] = new
        change = Change(self.rv, kind, table.resource, old, new)
        table.record(change)
        for watcher in list(table.watchers):
            watcher.offer(change)
        for listener in list(self.listeners):
            listener(change)
        return new

    # --- reads ------------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str, name: str) -> Stored:
        """One object, or 404."""
        stored = self.tables[resource.store_key].objects.get(namespace, {}).get(name)
        if stored is None:
            raise not_found(resource.plural, name, resource.group)
        return stored

    def find(self, resource: Resource, namespace: str, name: str) -> Stored | None:
        """One object, or ``None``."""
        return self.tables[resource.store_key].objects.get(namespace, {}).get(name)

    def candidates(
        self, resource: Resource, namespace: str | None, fields: FieldSelector | None
    ) -> Iterable[Stored]:
        """Objects a list may return, narrowed by namespace and by the cheapest index."""
        table = self.tables[resource.store_key]
        if fields is not None:
            namespace = namespace if namespace is not None else fields.equality("metadata.namespace")
            name = fields.equality("metadata.name")
            if name is not None and namespace is not None:
                one = table.objects.get(namespace, {}).get(name)
                return [one] if one is not None else []
            node = fields.equality("spec.nodeName") if table.by_node is not None else None
            if node is not None and table.by_node is not None:
                bucket = table.by_node.get(node, {})
                if namespace is None:
                    return list(bucket.values())
                return [s for (ns, _), s in bucket.items() if ns == namespace]
        if namespace is not None:
            return list(table.objects.get(namespace, {}).values())
        return list(table.all())

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        predicate: Predicate | None,
        fields: FieldSelector | None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[Stored], int, str | None]:
        """Matching objects, the list's resourceVersion and a continue token (when ``limit`` cut it)."""
        table = self.tables[resource.store_key]
        items = self.candidates(resource, namespace, fields)
        if predicate is not None:
            view = resource.to_view
            items = [s for s in items if predicate(view(s.obj))]
        list_rv = self.rv
        if continue_token:
            list_rv, start = _decode_continue(continue_token)
            if list_rv < table.floor:
                raise gone(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter."
                )
            items = [s for s in items if (s.namespace, s.name) > start]
        if limit is None and not continue_token:
            return list(items), list_rv, None
        items = sorted(items, key=lambda s: (s.namespace, s.name))
        if limit is not None and len(items) > limit:
            last = items[limit - 1]
            return items[:limit], list_rv, _encode_continue(list_rv, (last.namespace, last.name))
        return items, list_rv, None

    # --- watch ------------------------------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        predicate: Predicate | None,
        resource_version: str | None,
        *,
        initial_events: bool,
    ) -> Watcher:
        """Open a watcher, queued with what happened after ``resource_version`` (or the current state).

        Without a resourceVersion (or with ``0``), or with ``initial_events``, the current state comes
        first as synthetic ADDED events. A resourceVersion older than the kept history is 410.
        """
        table = self.tables[resource.store_key]
        watcher = Watcher(resource, namespace, predicate, self.max_watch_pending)
        if initial_events or resource_version in (None, "", "0"):
            snapshot = (
                table.objects.get(namespace, {}).values() if namespace is not None else list(table.all())
            )
            for stored in snapshot:
                if watcher.matches(stored):
                    watcher.pending.append(("ADDED", stored))
        else:
            since = _parse_rv(resource_version or "")
            if since < table.floor:
                raise gone(f"too old resource version: {since} ({table.floor})")
            for change in table.since(since):
                watcher.offer(change)
        table.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        """Forget a finished watcher."""
        self.tables[watcher.resource.store_key].watchers.discard(watcher)

    def close_watches(self, resource: Resource | None = None) -> int:
        """End every open watch stream (of one resource's storage, or all); returns how many."""
        closed = 0
        for key, table in self.tables.items():
            if resource is not None and key != resource.store_key:
                continue
            for watcher in list(table.watchers):
                watcher.close()
                closed += 1
        return closed

    # --- writes -----------------------------------------------------------------------------------

    def _check_kind(self, resource: Resource, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise bad_request(f"the body of a {resource.kind} request must be a JSON object")
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, "", resource.kind) or api_version not in (None, "", resource.api_version):
            raise bad_request(
                f"the API version in the data ({api_version}) and kind ({kind}) do not match "
                f"the expected {resource.api_version} {resource.kind}"
            )
        meta = obj.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if not isinstance(meta.get("labels", {}) or {}, dict) or not isinstance(
            meta.get("annotations", {}) or {}, dict
        ):
            raise bad_request("metadata.labels and metadata.annotations must be JSON objects")
        out = dict(obj)
        out["metadata"] = dict(meta)
        return out

    def _incoming(self, resource: Resource, body: Any) -> dict[str, Any]:
        """A request body checked against the resource's wire form, then in storage form."""
        checked = self._check_kind(resource, body)
        return resource.from_view(checked) if resource.storage else checked

    def _check_namespace(self, resource: Resource, namespace: str, meta: dict[str, Any]) -> None:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return
        body_ns = meta.get("namespace") or namespace
        if body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace

    def _ensure_namespace(self, namespace: str) -> None:
        namespaces = BY_STORAGE["namespaces"]
        if self.find(namespaces, "", namespace) is not None:
            return
        if not self.auto_namespaces:
            raise not_found("namespaces", namespace)
        self.create(namespaces, "", {"metadata": {"name": namespace}})

    def create(self, resource: Resource, namespace: str, body: Any, *, keep_status: bool = False) -> Stored:
        """POST: a new object (201); 409 AlreadyExists when the name is taken.

        ``keep_status`` keeps a given ``status`` over the server's create defaults (for seeding).
        """
        obj = self._incoming(resource, body)
        base = BY_STORAGE[resource.store_key]
        obj["kind"], obj["apiVersion"] = base.kind, base.api_version
        meta = obj["metadata"]
        self._check_namespace(resource, namespace, meta)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = str(meta["generateName"]) + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        pattern = _LABEL if base.plural == "namespaces" else _SUBDOMAIN
        if not isinstance(name, str) or not name or len(name) > 253 or not pattern.match(name):
            raise invalid(
                resource.plural,
                str(name),
                f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 name is required",
            )
        meta["name"] = name
        if resource.namespaced:
            self._ensure_namespace(namespace)
        if self.find(resource, namespace, name) is not None:
            raise already_exists(resource.plural, name, resource.group)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        status = obj.get("status")
        apply_create_defaults(base.plural, obj)
        if keep_status and status is not None:
            obj["status"] = status
        self._validate(resource, obj)
        return self.commit(base, "ADDED", None, obj)

    def _validate(self, resource: Resource, obj: dict[str, Any]) -> None:
        if resource.group == "events.k8s.io":
            name = obj["metadata"]["name"]
            for wire, core in (
                ("eventTime", "eventTime"),
                ("reportingController", "reportingComponent"),
                ("reportingInstance", "reportingInstance"),
                ("action", "action"),
                ("reason", "reason"),
            ):
                if not obj.get(core):
                    raise invalid("events", name, f"{wire}: Required value")
        if obj.get("kind") == "Event" and obj.get("type") not in (None, "", "Normal", "Warning"):
            raise invalid("events", obj["metadata"]["name"], f"type: Unsupported value: {obj['type']!r}")

    def replace(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Any,
        subresource: str = "",
    ) -> Stored:
        """PUT: replace an object; a stale ``metadata.resourceVersion`` is a 409 Conflict."""
        obj = self._incoming(resource, body)
        old = self.get(resource, namespace, name)
        return self._update(resource, old, obj, subresource)

    def incoming(self, resource: Resource, body: Any) -> dict[str, Any]:
        """A PUT body as an object to update with (400 when it is not one)."""
        return self._incoming(resource, body)

    def patched(
        self,
        resource: Resource,
        old: Stored,
        content_type: str,
        body: Any,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """``old`` with a patch applied (not stored); ``check`` sees the patched wire form and may raise."""
        try:
            patched = apply_patch(content_type, resource.to_view(old.obj), body)
        except PatchError as err:
            if err.unprocessable:
                raise ApiError(422, str(err)) from err
            raise bad_request(str(err)) from err
        if check is not None:
            check(patched)
        return self._incoming(resource, patched)

    def prepare_update(
        self, resource: Resource, old: Stored, obj: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any] | None:
        """The object an update of ``old`` to ``obj`` would store (checked), None when unchanged.

        With :meth:`commit_update` it is :meth:`replace` in two steps, so admission can judge the
        object (and its old version) between them.
        """
        return self._updated(resource, old, obj, subresource)

    def commit_update(self, resource: Resource, old: Stored, obj: dict[str, Any]) -> Stored:
        """Store what :meth:`prepare_update` gave for ``old`` (which must still be current)."""
        base = BY_STORAGE[resource.store_key]
        if self.find(resource, old.namespace, old.name) is not old:
            raise conflict(resource.plural, old.name, STALE, resource.group)
        meta, old_meta = obj["metadata"], old.obj["metadata"]
        if meta.get("deletionTimestamp") and old_meta.get("finalizers") and not meta.get("finalizers"):
            deleted = dict(obj)
            deleted["metadata"] = dict(meta)
            return self.commit(base, "DELETED", old, deleted)
        return self.commit(base, "MODIFIED", old, obj)

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        subresource: str = "",
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> Stored:
        """PATCH: apply a patch; a ``metadata.resourceVersion`` it sets is a precondition.

        ``check`` sees the patched object (wire form) before anything is stored and may raise.
        """
        old = self.get(resource, namespace, name)
        return self._update(
            resource, old, self.patched(resource, old, content_type, body, check), subresource
        )

    def _update(self, resource: Resource, old: Stored, obj: dict[str, Any], subresource: str) -> Stored:
        updated = self._updated(resource, old, obj, subresource)
        return old if updated is None else self.commit_update(resource, old, updated)

    def _updated(
        self, resource: Resource, old: Stored, obj: dict[str, Any], subresource: str
    ) -> dict[str, Any] | None:
        base = BY_STORAGE[resource.store_key]
        meta = obj["metadata"]
        name = old.name
        if meta.get("name") not in (None, "", name):
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        self._check_namespace(resource, old.namespace, meta)
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv not in (None, "") and str(wanted_rv) != old.obj["metadata"]["resourceVersion"]:
            raise conflict(resource.plural, name, STALE, resource.group)
        if meta.get("uid") not in (None, "", old.obj["metadata"]["uid"]):
            raise conflict(
                resource.plural,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {old.obj['metadata']['uid']}",
                resource.group,
            )
        obj["kind"], obj["apiVersion"] = base.kind, base.api_version
        old_meta = old.obj["metadata"]
        obj = _split_status(old.obj, obj, subresource, base.has_status)
        meta = obj["metadata"]
        for key in _IMMUTABLE_META:
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["namespace"] = old_meta.get("namespace")
        if not resource.namespaced:
            meta.pop("namespace", None)
        meta.pop("managedFields", None)
        generation = int(old_meta.get("generation", 1))
        if subresource != "status" and _spec_part(obj) != _spec_part(old.obj):
            generation += 1
        meta["generation"] = generation
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if base.plural == "pods":
            quantities_as_text(obj)
        self._validate(resource, obj)
        return None if obj == old.obj else obj

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
    ) -> Stored:
        """DELETE: remove an object (a DELETED event), or mark it while finalizers remain."""
        base = BY_STORAGE[resource.store_key]
        old = self.get(resource, namespace, name)
        options = options or {}
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, dict):
            raise bad_request("preconditions must be a JSON object")
        old_meta = old.obj["metadata"]
        if preconditions.get("uid") not in (None, "", old_meta["uid"]):
            raise conflict(
                resource.plural,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {old_meta['uid']}",
                resource.group,
            )
        if preconditions.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise conflict(
                resource.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {preconditions['resourceVersion']}, "
                f"ResourceVersion in object meta: {old_meta['resourceVersion']}",
                resource.group,
            )
        grace = options.get("gracePeriodSeconds")
        if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool) or grace < 0):
            raise bad_request("gracePeriodSeconds must be a non-negative integer")
        obj = dict(old.obj)
        obj["metadata"] = meta = dict(old_meta)
        if old_meta.get("finalizers"):
            if old_meta.get("deletionTimestamp"):
                return old
            meta["deletionTimestamp"] = now_rfc3339()
            meta["deletionGracePeriodSeconds"] = 0
            return self.commit(base, "MODIFIED", old, obj)
        if self._graceful(base, old, grace):
            if old_meta.get("deletionTimestamp"):
                return old
            period = (
                grace if grace is not None else int(old.obj["spec"].get("terminationGracePeriodSeconds", 30))
            )
            meta["deletionTimestamp"] = now_rfc3339(period)
            meta["deletionGracePeriodSeconds"] = period
            return self.commit(base, "MODIFIED", old, obj)
        if base.plural == "namespaces":
            self._delete_namespace_contents(name)
        return self.commit(base, "DELETED", old, obj)

    def _graceful(self, base: Resource, old: Stored, grace: int | None) -> bool:
        if not self.graceful_pod_deletion or base.plural != "pods" or grace == 0:
            return False
        phase = (old.obj.get("status") or {}).get("phase")
        return bool(_node_of(old.obj)) and phase not in ("Succeeded", "Failed")

    def _delete_namespace_contents(self, namespace: str) -> None:
        for key, table in self.tables.items():
            if not table.resource.namespaced:
                continue
            for stored in list(table.objects.get(namespace, {}).values()):
                obj = dict(stored.obj)
                obj["metadata"] = dict(stored.obj["metadata"])
                self.commit(BY_STORAGE[key], "DELETED", stored, obj)

    def bind(self, namespace: str, body: Any, pod_name: str | None = None) -> None:
        """``pods/binding``: set ``spec.nodeName``; 409 when the pod is already bound or being deleted."""
        pods = BY_STORAGE["pods"]
        if not isinstance(body, dict):
            raise bad_request("the body of a Binding must be a JSON object")
        meta = body.get("metadata") or {}
        target = body.get("target") or {}
        if not isinstance(meta, dict) or not isinstance(target, dict):
            raise bad_request("Binding metadata and target must be JSON objects")
        name = pod_name or str(meta.get("name") or "")
        if pod_name and meta.get("name") not in (None, "", pod_name):
            raise bad_request(
                f"the name of the Binding ({meta['name']}) does not match the pod on the URL ({pod_name})"
            )
        node = target.get("name")
        if not name or not isinstance(node, str) or not node:
            raise invalid("bindings", name, "target.name: Required value")
        old = self.get(pods, namespace, name)
        old_meta = old.obj["metadata"]
        if meta.get("uid") not in (None, "", old_meta["uid"]):
            raise conflict("pods/binding", name, f"Precondition failed: UID in precondition: {meta['uid']}")
        if old_meta.get("deletionTimestamp"):
            raise conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
        bound = _node_of(old.obj)
        if bound:
            raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{bound}"')
        obj = dict(old.obj)
        obj["metadata"] = dict(old_meta)
        if meta.get("annotations"):
            obj["metadata"]["annotations"] = {**(old_meta.get("annotations") or {}), **meta["annotations"]}
        obj["spec"] = {**obj.get("spec", {}), "nodeName": node}
        status = dict(obj.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
        status["conditions"] = conditions
        obj["status"] = status
        self.commit(pods, "MODIFIED", old, obj)

    def put(self, obj: dict[str, Any]) -> Stored:
        """Create or overwrite an object as given, status included (for seeding; no preconditions)."""
        resource = resource_of(obj)
        meta = objects.metadata(obj)
        namespace = objects.namespace(obj) or ("default" if resource.namespaced else "")
        name = objects.name(obj)
        old = self.find(resource, namespace, name)
        if old is None:
            return self.create(resource, namespace, obj, keep_status=True)
        body = dict(obj)
        body["metadata"] = {k: v for k, v in meta.items() if k != "resourceVersion"}
        result = self._update(resource, old, self._check_kind(resource, body), "")
        if "status" in obj and resource.has_status:
            with_status = dict(result.obj)
            with_status["status"] = obj["status"]
            result = self._update(resource, result, self._check_kind(resource, with_status), "status")
        return result


def _split_status(
    old: dict[str, Any], obj: dict[str, Any], subresource: str, has_status: bool
) -> dict[str, Any]:
    """What a write may change: on ``/status`` only status, labels and annotations; on the main path
    of a resource with a status subresource everything but status."""
    if subresource == "status":
        new = dict(old)
        new["metadata"] = dict(old["metadata"])
        for key in ("labels", "annotations"):
            if key in obj["metadata"]:
                new["metadata"][key] = obj["metadata"][key]
            else:
                new["metadata"].pop(key, None)
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
        return new
    if has_status:
        if "status" in old:
            obj["status"] = old["status"]
        else:
            obj.pop("status", None)
    return obj


def resource_of(obj: Any) -> Resource:
    """The stored resource an object's ``apiVersion`` and ``kind`` name (400 when not served)."""
    if not isinstance(obj, dict):
        raise bad_request("an object must be a JSON object")
    for resource in RESOURCES:
        if (
            resource.stored
            and resource.kind == obj.get("kind")
            and resource.api_version == obj.get("apiVersion")
        ):
            return resource
    raise bad_request(f"the embedded API server does not store {obj.get('apiVersion')}/{obj.get('kind')}")


def _encode_continue(rv: int, start: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(dumps({"rv": rv, "start": list(start)})).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        rv, (ns, name) = int(data["rv"]), data["start"]
        return rv, (str(ns), str(name))
    except (ValueError, KeyError, TypeError, binascii.Error) as err:
        raise bad_request(f"invalid continue token {token!r}") from err

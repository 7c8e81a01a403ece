"""Watch-fed caches (informers) of trimmed raw-JSON objects, with add/update/delete callbacks.

A cache's records are read-only views (:mod:`hamid.model.kube`): the cache hands the same object
to every callback and reader, so none may change it.

A cache lists, then watches from the list's resourceVersion; a dropped stream resumes from the
last resourceVersion seen; ``410 Gone`` triggers a re-list whose differences are delivered as
add/update/delete callbacks, so consumers stay exact. A list's objects are told oldest first
(:func:`creation_order`), as the watch told them, not in the API server's key order: a consumer
that weighs what it saw by recency (the ``fgd`` policy's learned workload) rebuilds the same.
Errors back off (bounded, jittered). Callbacks are synchronous and run on the event loop, in event order.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Generic, TypeVar

from typing_extensions import TypedDict, Unpack

from hamid.kube.backoff import Backoff
from hamid.kube.client import (
    NODES,
    PODS,
    RESOURCE_QUOTAS,
    KubeClient,
    Resource,
    WatchEvent,
)
from hamid.kube.errors import Gone, Timeout
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.kube import JSON, Body, Node, Pod, ResourceQuota, view
from hamid.model.objects import newer_than, object_key

log = get_logger("kube.cache")

#: A cache's record type: a read-only view of the objects it holds.
Record = TypeVar("Record", bound=Mapping[str, Any], covariant=True)
AddHandler = Callable[[Record], None]
UpdateHandler = Callable[[Record, Record], None]
DeleteHandler = Callable[[Record], None]
#: Turns a listed or watched object (the cache's own copy) into the record it keeps.
Trim = Callable[[JSON], Record]


class CacheOptions(TypedDict, Generic[Record], total=False):
    """The :class:`WatchCache` options the typed caches pass through (handlers typed by record)."""

    on_add: AddHandler[Record] | None
    on_update: UpdateHandler[Record] | None
    on_delete: DeleteHandler[Record] | None
    watch_timeout_s: int
    page_size: int | None
    backoff: Backoff | None


# The parts of status hamid reads; everything else is dropped from cached records.
POD_STATUS_KEYS = frozenset(
    {"phase", "reason", "conditions", "containerStatuses", "initContainerStatuses", "qosClass"}
)
NODE_STATUS_KEYS = frozenset({"allocatable", "capacity", "conditions"})


def trim_metadata(obj: JSON) -> JSON:
    """Drop ``metadata.managedFields`` (in place) and return the object."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


def _keep_status(obj: JSON, keys: frozenset[str]) -> JSON:
    trim_metadata(obj)
    status = obj.get("status")
    if status:
        obj["status"] = {k: v for k, v in status.items() if k in keys}
    return obj


def trim_pod(obj: JSON) -> Pod:
    """A lightweight pod record: no managedFields; status keeps phase/conditions/container statuses."""
    return view(Pod, _keep_status(obj, POD_STATUS_KEYS))


def trim_node(obj: JSON) -> Node:
    """A lightweight node record: no managedFields; status keeps allocatable/capacity/conditions."""
    return view(Node, _keep_status(obj, NODE_STATUS_KEYS))


def trim_quota(obj: JSON) -> ResourceQuota:
    """A ResourceQuota record: no managedFields; spec and status kept whole."""
    return view(ResourceQuota, trim_metadata(obj))


def creation_order(obj: Mapping[str, Any]) -> tuple[str, int, str]:
    """Where an object was created among a list's: its ``creationTimestamp`` (UTC RFC 3339, whole
    seconds: compares as text), then its resourceVersion (its creation's while it is unchanged,
    else its last change: the closest a list tells), then its key."""
    created = objects.metadata(obj).get("creationTimestamp")
    version = objects.version_number(objects.resource_version(obj))
    return (created if isinstance(created, str) else "", -1 if version is None else version, object_key(obj))


def join_selectors(*selectors: str | None) -> str | None:
    """Comma-join the non-empty selectors (None when all are empty)."""
    parts = [s for s in selectors if s]
    return ",".join(parts) or None


class WatchCache(Generic[Record]):
    """A list+watch cache of one resource, keyed ``namespace/name`` (or ``name`` if cluster-scoped).

    ``run()`` is a coroutine owned by the caller (a TaskGroup task); cancelling it stops the cache.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        trim: Trim[Record],
        on_add: AddHandler[Record] | None = None,
        on_update: UpdateHandler[Record] | None = None,
        on_delete: DeleteHandler[Record] | None = None,
        watch_timeout_s: int = 300,
        page_size: int | None = 500,
        backoff: Backoff | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.watch_timeout_s = watch_timeout_s
        self.page_size = page_size
        self._trim = trim
        self._backoff = backoff or Backoff()
        self._items: dict[str, Record] = {}
        self._resource_version: str | None = None
        self._synced = asyncio.Event()
        self._add: list[AddHandler[Record]] = []
        self._update: list[UpdateHandler[Record]] = []
        self._delete: list[DeleteHandler[Record]] = []
        self.relists = 0
        self.add_handlers(on_add=on_add, on_update=on_update, on_delete=on_delete)
        self._log = log.bind(
            resource=resource.plural,
            namespace=namespace,
            field_selector=field_selector,
            label_selector=label_selector,
        )

    def add_handlers(
        self,
        on_add: AddHandler[Record] | None = None,
        on_update: UpdateHandler[Record] | None = None,
        on_delete: DeleteHandler[Record] | None = None,
    ) -> None:
        """Register more callbacks (call before ``run()`` to see the initial adds)."""
        if on_add is not None:
            self._add.append(on_add)
        if on_update is not None:
            self._update.append(on_update)
        if on_delete is not None:
            self._delete.append(on_delete)

    # -- reading ----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first list has been applied."""
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        """The last resourceVersion applied (None before the first list / after a 410)."""
        return self._resource_version

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait for the first list; raise :class:`~hamid.kube.errors.Timeout` after ``timeout`` s."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError as exc:
            raise Timeout(f"{self.resource.plural} cache not synced within {timeout:g}s") from exc

    def get(self, key: str) -> Record | None:
        """The cached object for ``namespace/name`` (or ``name``), or None."""
        return self._items.get(key)

    def values(self) -> list[Record]:
        """A snapshot list of the cached objects."""
        return list(self._items.values())

    def keys(self) -> list[str]:
        """A snapshot list of the keys."""
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    # -- callbacks --------------------------------------------------------------------------

    def _notify(self, handlers: list[Callable[..., None]], *args: Body) -> None:
        for handler in handlers:
            try:
                handler(*args)
            except Exception:
                self._log.exception(
                    "cache_callback_failed", handler=getattr(handler, "__qualname__", handler)
                )

    def _added(self, obj: Body) -> None:
        self._notify(self._add, obj)

    def _updated(self, old: Body, new: Body) -> None:
        if objects.uid(old) != objects.uid(new):
            # Same name, new object: consumers keyed by UID see the old one go and the new one come.
            self._notify(self._delete, old)
            self._notify(self._add, new)
        else:
            self._notify(self._update, old, new)

    def _deleted(self, obj: Body) -> None:
        self._notify(self._delete, obj)

    def forget_missing(self, listed: Collection[str], list_version: str) -> int:
        """Drop cached objects a fresh list (taken at ``list_version``) no longer holds.

        Only objects not changed since the list are dropped — a delete the watch never delivered —
        with ``on_delete`` callbacks as for a watched delete. Returns how many were dropped.
        """
        stale = [
            key
            for key, obj in self._items.items()
            if key not in listed and not newer_than(objects.resource_version(obj), list_version)
        ]
        for key in stale:
            self._deleted(self._items.pop(key))
        if stale:
            self._log.warning("cache_dropped_unlisted", keys=stale)
        return len(stale)

    # -- list and watch ---------------------------------------------------------------------

    def record(self, obj: JSON) -> Record:
        """What the cache keeps of an object as listed or watched (kind filled in, trimmed)."""
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        return self._trim(obj)

    async def _relist(self) -> None:
        fresh: dict[str, Record] = {}
        created: dict[str, tuple[str, int, str]] = {}
        resource_version = ""
        async for page, version in self.client.list_pages(
            self.resource,
            self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
            page_size=self.page_size,
        ):
            resource_version = version
            for item in page:  # trimmed page by page: one page of whole objects alive at a time
                key = object_key(item)
                created[key] = creation_order(item)  # before the trim drops the timestamp
                fresh[key] = self.record(item)
            del page
        old = self._items
        self._items = fresh
        self._resource_version = resource_version
        self.relists += 1
        for key, obj in old.items():
            if key not in fresh:
                self._deleted(obj)
        for key in sorted(fresh, key=created.__getitem__):  # oldest first, as the watch told them
            obj = fresh[key]
            previous = old.get(key)
            if previous is None:
                self._added(obj)
            elif objects.resource_version(previous) != objects.resource_version(obj):
                self._updated(previous, obj)
        self._synced.set()
        self._log.debug("listed", count=len(fresh), resource_version=resource_version)

    def _apply(self, event: WatchEvent) -> None:
        resource_version = objects.resource_version(event.object)
        if event.type == "BOOKMARK":
            if resource_version:
                self._resource_version = resource_version
            return
        obj = self.record(event.object)
        key = object_key(obj)
        if event.type == "DELETED":
            previous = self._items.pop(key, None)
            if previous is not None:
                self._deleted(obj)
        elif event.type in ("ADDED", "MODIFIED"):
            previous = self._items.get(key)
            self._items[key] = obj
            if previous is None:
                self._added(obj)
            else:
                self._updated(previous, obj)
        else:
            self._log.warning("watch_event_unknown", type=event.type, key=key)
        if resource_version:
            self._resource_version = resource_version

    async def _watch_once(self) -> int:
        """Follow one watch stream until it ends; return how many events it carried."""
        assert self._resource_version is not None
        count = 0
        stream = self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self._resource_version,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
            timeout_seconds=self.watch_timeout_s,
        )
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                self._apply(event)
                count += 1
        return count

    async def run(self) -> None:
        """List, then watch forever (resume, re-list on 410, back off on errors) until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self._resource_version is None:
                    await self._relist()
                    self._backoff.reset()
                started = loop.time()
                events = await self._watch_once()
                if events or loop.time() - started >= 1.0:
                    self._backoff.reset()
                    continue
                # An empty stream that ended at once: do not spin against the server.
                await asyncio.sleep(self._backoff.next())
            except Gone:
                self._log.info("watch_expired_relisting", resource_version=self._resource_version)
                self._resource_version = None
            except Exception as exc:
                delay = self._backoff.next()
                self._log.warning(
                    "list_watch_failed_backing_off",
                    error=str(exc),
                    error_type=type(exc).__name__,
                    retry_in_s=round(delay, 3),
                )
                await asyncio.sleep(delay)


class PodCache(WatchCache[Pod]):
    """Pods as lightweight records, optionally scoped to one node (``spec.nodeName``) and labels."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str | None = None,
        node_name: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        trim: Trim[Pod] = trim_pod,
        **kwargs: Unpack[CacheOptions[Pod]],
    ) -> None:
        selector = join_selectors(f"spec.nodeName={node_name}" if node_name else None, field_selector)
        super().__init__(
            client,
            PODS,
            namespace=namespace,
            field_selector=selector,
            label_selector=label_selector,
            trim=trim,
            **kwargs,
        )


class NodeCache(WatchCache[Node]):
    """Nodes as lightweight records (annotations, labels, allocatable/capacity, conditions)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        trim: Trim[Node] = trim_node,
        **kwargs: Unpack[CacheOptions[Node]],
    ) -> None:
        super().__init__(
            client, NODES, field_selector=field_selector, label_selector=label_selector, trim=trim, **kwargs
        )


class ResourceQuotaCache(WatchCache[ResourceQuota]):
    """ResourceQuotas (metadata trimmed; spec and status kept whole)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str | None = None,
        **kwargs: Unpack[CacheOptions[ResourceQuota]],
    ) -> None:
        super().__init__(client, RESOURCE_QUOTAS, namespace=namespace, trim=trim_quota, **kwargs)

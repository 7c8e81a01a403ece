"""An in-process stand-in for the API server, for ``bench/trace.py``: the KubeClient calls the
scheduler, its caches and the plugin make, on plain dicts, without HTTP.

Objects keep a resourceVersion; a metadata patch with a stale ``resource_version`` (or another
``uid``) raises :class:`~hamid.kube.errors.Conflict` and writes nothing, a Binding of a bound pod
too, as the API server does. Watches are real async streams (``WatchCache.run`` lists and watches
through them); :meth:`MemoryApi.settle` waits until every event written has been applied by its
cache, so each step of a pod sees the previous step's writes, as on an idle cluster.
Field selectors: ``spec.nodeName=<node>`` and ``metadata.name=<node>`` (what the caches use).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from hamid.kube.client import NODES, PODS, Resource, WatchEvent
from hamid.kube.errors import Conflict, NotFound
from hamid.model.kube import JSON

_SELECTABLE = ("spec.nodeName", "metadata.name")


def _copy(obj: JSON) -> JSON:
    copy: JSON = json.loads(json.dumps(obj))
    return copy


def _selector(field_selector: str | None) -> tuple[str, str] | None:
    if not field_selector:
        return None
    field, _, value = field_selector.partition("=")
    if field not in _SELECTABLE or "," in value or value.startswith("="):
        raise ValueError(f"the trace bench's API serves no field selector {field_selector!r}")
    return field, value


def _selected(obj: JSON, selector: tuple[str, str] | None) -> bool:
    if selector is None:
        return True
    field, value = selector
    if field == "metadata.name":
        return bool(obj["metadata"]["name"] == value)
    return bool((obj.get("spec") or {}).get("nodeName", "") == value)


def _merge(meta: JSON, field: str, values: Mapping[str, str | None] | None) -> None:
    if not values:
        return
    current = meta.setdefault(field, {})
    for key, value in values.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value


class MemoryApi:
    """Pods and nodes in memory, with the KubeClient verbs hamid's scheduler and plugin call."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {}
        self.nodes: dict[str, JSON] = {}
        self.version = 0
        self.writes = 0
        #: resource → field selector (None: every object) → the queues of the watches with it.
        self._watchers: dict[str, dict[tuple[str, str] | None, list[asyncio.Queue[WatchEvent]]]] = {
            PODS.plural: {},
            NODES.plural: {},
        }
        self._pending = 0
        self._applied = asyncio.Event()
        self._applied.set()

    def _table(self, resource: Resource) -> dict[str, JSON]:
        if resource.plural == PODS.plural:
            return self.pods
        if resource.plural == NODES.plural:
            return self.nodes
        return {}

    def _commit(self, resource: Resource, key: str, obj: JSON, kind: str) -> JSON:
        self.version += 1
        self.writes += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._table(resource)[key] = obj
        watchers = self._watchers[resource.plural]
        raw = json.dumps(obj)  # one encoding; each watch and the caller decode their own copy
        spec = obj.get("spec") or {}
        for selector in (
            None,
            ("metadata.name", obj["metadata"]["name"]),
            ("spec.nodeName", spec.get("nodeName", "")),
        ):
            for queue in watchers.get(selector, ()):
                queue.put_nowait(WatchEvent(kind, json.loads(raw)))
                self._pending += 1
                self._applied.clear()
        stored: JSON = json.loads(raw)
        return stored

    async def settle(self) -> None:
        """Wait until every watch event written so far has been applied by its cache."""
        await self._applied.wait()

    # -- list and watch (WatchCache) ------------------------------------------------------------

    async def list_objects(
        self, resource: Resource, namespace: str | None = None, *, field_selector: str | None = None, **_: Any
    ) -> tuple[list[JSON], str]:
        """Every object of ``resource`` the selector matches, and the current resourceVersion."""
        selector = _selector(field_selector)
        table = self._table(resource)
        if selector is not None and selector[0] == "metadata.name" and resource.plural == NODES.plural:
            node = table.get(selector[1])  # nodes are keyed by name: each plugin's list is one lookup
            return ([] if node is None else [_copy(node)]), str(self.version)
        items = [_copy(o) for o in table.values() if _selected(o, selector)]
        return items, str(self.version)

    async def list_pages(
        self, resource: Resource, namespace: str | None = None, *, field_selector: str | None = None, **_: Any
    ) -> AsyncIterator[tuple[list[JSON], str]]:
        """:meth:`list_objects` as one page (what the watch caches read)."""
        yield await self.list_objects(resource, namespace, field_selector=field_selector)

    async def watch(
        self, resource: Resource, namespace: str | None = None, *, field_selector: str | None = None, **_: Any
    ) -> AsyncIterator[WatchEvent]:
        """Events after the list, until the watching cache is cancelled (objects are never deleted)."""
        queue = asyncio.Queue[WatchEvent]()
        watchers = self._watchers.get(resource.plural)
        if watchers is None:  # resourcequotas: there are none, and none come
            await asyncio.Event().wait()
            return
        selector = _selector(field_selector)
        watchers.setdefault(selector, []).append(queue)
        try:
            while True:
                event = await queue.get()
                self._pending -= 1
                if not self._pending:  # the cache applies it before it next awaits
                    self._applied.set()
                yield event
        finally:
            watchers[selector].remove(queue)

    # -- writes the bench makes (pod creation, nodes, status) ----------------------------------------

    def put_node(self, node: JSON) -> JSON:
        """Create or replace a node."""
        return self._commit(NODES, node["metadata"]["name"], _copy(node), "ADDED")

    def create_pod(self, pod: JSON) -> JSON:
        """Create a pod (as admitted by the webhook)."""
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if key in self.pods:
            raise Conflict(f"pod {key} already exists", status=409)
        return self._commit(PODS, key, _copy(pod), "ADDED")

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any], **_: Any) -> JSON:
        """Merge ``status`` into the pod's status (kubelet's status manager)."""
        pod = self._stored(self.pods, f"{namespace}/{name}", "pods")
        pod.setdefault("status", {}).update(_copy(dict(status)))
        return self._commit(PODS, f"{namespace}/{name}", pod, "MODIFIED")

    # -- the KubeClient verbs -------------------------------------------------------------------

    def _stored(self, table: dict[str, JSON], key: str, what: str) -> JSON:
        """The stored object itself, for a write to change in place after its checks passed (every
        reader gets a copy: the table's objects are never handed out)."""
        obj = table.get(key)
        if obj is None:
            raise NotFound(f'{what} "{key.rpartition("/")[2]}" not found', status=404)
        return obj

    async def get_pod(self, namespace: str, name: str, **_: Any) -> JSON:
        """GET a pod."""
        return _copy(self._stored(self.pods, f"{namespace}/{name}", "pods"))

    async def list_pods(
        self, namespace: str | None = None, field_selector: str | None = None, **_: Any
    ) -> tuple[list[JSON], str]:
        """LIST pods (by ``spec.nodeName``)."""
        return await self.list_objects(PODS, namespace, field_selector=field_selector)

    async def get_node(self, name: str, **_: Any) -> JSON:
        """GET a node."""
        return _copy(self._stored(self.nodes, name, "nodes"))

    @staticmethod
    def _check(obj: JSON, resource_version: str | None, uid: str | None) -> None:
        meta = obj["metadata"]
        if resource_version is not None and meta.get("resourceVersion") != resource_version:
            raise Conflict(f"{meta['name']}: the object has been modified", status=409)
        if uid is not None and meta.get("uid") != uid:
            raise Conflict(f"{meta['name']}: precondition failed: UID mismatch", status=409)

    async def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
        **_: Any,
    ) -> JSON:
        """Merge-patch a pod's annotations and labels (preconditions as the API server checks them)."""
        pod = self._stored(self.pods, f"{namespace}/{name}", "pods")
        self._check(pod, resource_version, uid)
        _merge(pod["metadata"], "annotations", annotations)
        _merge(pod["metadata"], "labels", labels)
        return self._commit(PODS, f"{namespace}/{name}", pod, "MODIFIED")

    async def patch_node_metadata(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        **_: Any,
    ) -> JSON:
        """Merge-patch a node's annotations and labels."""
        node = self._stored(self.nodes, name, "nodes")
        self._check(node, resource_version, None)
        _merge(node["metadata"], "annotations", annotations)
        _merge(node["metadata"], "labels", labels)
        return self._commit(NODES, name, node, "MODIFIED")

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **_: Any) -> None:
        """A Binding: set ``spec.nodeName`` once."""
        pod = self._stored(self.pods, f"{namespace}/{name}", "pods")
        self._check(pod, None, uid)
        if pod["spec"].get("nodeName"):
            raise Conflict(f"pod {name} is already assigned to node {pod['spec']['nodeName']}", status=409)
        if node not in self.nodes:
            raise NotFound(f'nodes "{node}" not found', status=404)
        pod["spec"]["nodeName"] = node
        self._commit(PODS, f"{namespace}/{name}", pod, "MODIFIED")

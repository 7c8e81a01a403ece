"""The node-scoped view the plugin reads pods and its node lock from (watch-fed, no LIST per call).

Pods come from a :class:`~hamid.kube.cache.PodCache` scoped with ``spec.nodeName=<node>`` and the
node from a :class:`~hamid.kube.cache.NodeCache` scoped with ``metadata.name=<node>``. The plugin's
own writes are overlaid until the watch catches up, so a second Allocate right after the first
never reads the entry it just consumed.
"""

from __future__ import annotations

import asyncio

from hamid.kube.cache import NodeCache, PodCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import NotFound
from hamid.log import get_logger
from hamid.model import nodelock
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, Body, Node, NodeBody, Pod, PodBody, view
from hamid.model.objects import object_key, resource_version, version_at_least

log = get_logger("plugin.pods")


class NodePods:
    """Pods bound to one node, that node, and the plugin's own recent writes on top."""

    def __init__(self, client: KubeClient, node_name: str, *, call_timeout: float = 5.0) -> None:
        self.client = client
        self.node_name = node_name
        self.call_timeout = call_timeout
        self._overlay: dict[str, JSON] = {}
        #: The node as the plugin's last write returned it, until the cache has that version.
        self._own_node: Node | None = None
        self.pod_cache = PodCache(client, node_name=node_name, on_delete=self._forget)
        self.node_cache = NodeCache(client, field_selector=f"metadata.name={node_name}")

    async def run(self) -> None:
        """Run both caches until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.pod_cache.run())
            tg.create_task(self.node_cache.run())

    async def wait_synced(self) -> None:
        """Wait until both caches hold a complete list (bound it with ``asyncio.timeout``)."""
        await self.pod_cache.wait_synced()
        await self.node_cache.wait_synced()

    def _forget(self, pod: Body) -> None:
        self._overlay.pop(object_key(pod), None)

    def remember(self, pod: JSON) -> None:
        """Overlay a pod the plugin just wrote (until the cache has that version)."""
        self._overlay[object_key(pod)] = pod

    def _merged(self, key: str, cached: Pod | None) -> PodBody | None:
        ours = self._overlay.get(key)
        if ours is None:
            return cached
        if cached is not None and version_at_least(resource_version(cached), resource_version(ours)) is True:
            del self._overlay[key]
            return cached
        return ours

    def pod(self, key: str) -> PodBody | None:
        """One pod by ``namespace/name`` (cache with the overlay applied)."""
        return self._merged(key, self.pod_cache.get(key))

    def pods(self) -> list[PodBody]:
        """Every pod on the node (cache with the overlay applied)."""
        out = []
        for key in self.pod_cache:
            merged = self._merged(key, self.pod_cache.get(key))
            if merged is not None:
                out.append(merged)
        return out

    def node(self) -> Node | None:
        """The node record from the cache, or the plugin's own newer write (None until seen)."""
        cached = self.node_cache.get(self.node_name)
        ours = self._own_node
        if ours is None:
            return cached
        # versions that cannot be ordered leave the cache in charge
        if (
            cached is not None
            and version_at_least(resource_version(cached), resource_version(ours)) is not False
        ):
            self._own_node = None
            return cached
        return ours

    def remember_node(self, node: JSON) -> None:
        """Overlay the node as a write of the plugin returned it (until the cache has that version):
        a resourceVersion-guarded write right after it (the lock release) then need not conflict."""
        self._own_node = view(Node, node)

    def lock_owner(self, node: NodeBody | None = None) -> str | None:
        """``namespace/name`` of the pod holding ``hami.io/mutex.lock`` (None: no lock or legacy form)."""
        try:
            lock = nodelock.read_lock(node if node is not None else self.node())
        except InvalidInput as exc:
            log.warning("node_lock_unparsable_ignored", node=self.node_name, error=str(exc))
            return None
        return None if lock is None else nodelock.holder_key(lock)

    async def fetch_pod(self, namespace: str, name: str, *, remember: bool = True) -> JSON | None:
        """One GET of a pod (when the cache lags); remembered in the overlay unless ``remember`` is
        False (a pod that may never be bound here). None when it is gone."""
        try:
            pod = await self.client.get_pod(namespace, name, timeout=self.call_timeout)
        except NotFound:
            return None
        if remember:
            self.remember(pod)
        return pod

    async def fetch_node(self) -> JSON:
        """One GET of the node."""
        return await self.client.get_node(self.node_name, timeout=self.call_timeout)

    async def fetch_all(self) -> tuple[JSON, list[JSON]]:
        """A fresh read past the caches: GET the node and LIST the pods bound to it.

        For when the watches may lag (a pod kubelet admits before the cache has it). The listed pods
        are at least as new as the plugin's own writes, so no overlay applies to them.
        """
        node = await self.fetch_node()
        return node, await self.fetch_pods()

    async def fetch_pods(self) -> list[JSON]:
        """One LIST of the pods bound to the node, past the caches: a complete, current list (what
        destroys MIG instances may rely on nothing less)."""
        pods, _version = await self.client.list_pods(
            field_selector=f"spec.nodeName={self.node_name}", timeout=self.call_timeout
        )
        return pods

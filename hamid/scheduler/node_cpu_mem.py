"""CPU and memory per node as kube-scheduler counts them, kept incrementally from the caches.

A node's room is its allocatable minus the requests of every pod on it: pods bound there
(``spec.nodeName``, whichever scheduler bound them; terminating ones too) until they finish
or go, and pods this
scheduler's filter has just placed there (:meth:`NodeCpuMem.assume`) until the cache shows them
bound (kube-scheduler's "assumed" pods). Each node's :meth:`version` grows on every change, so
a reader keyed on it recomputes only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hamid.fit.node_room import CpuMem, node_allocatable, pod_cpu_mem
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.errors import InvalidInput

log = get_logger("scheduler.cpu_mem")

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class NodeCpuMem:
    """Allocatable and requested CPU and memory of every node (event-loop owned)."""

    def __init__(self) -> None:
        self._allocatable: dict[str, CpuMem] = {}
        self._requested: dict[str, CpuMem] = {}
        #: uid -> (node, request, bound): every pod counted on a node.
        self._pods: dict[str, tuple[str, CpuMem, bool]] = {}
        #: Called with a node's name whenever its room changes (the ``fgd`` ranker's hook).
        self.on_change: Callable[[str], None] | None = None

    def room(self, node: str, without: str = "") -> CpuMem | None:
        """Allocatable minus requests (None: the node publishes no allocatable cpu/memory), but
        the request of pod ``without`` (a UID) if counted there."""
        allocatable = self._allocatable.get(node)
        if allocatable is None:
            return None
        room = allocatable - self._requested.get(node, CpuMem())
        counted = self._pods.get(without)
        return room + counted[1] if counted is not None and counted[0] == node else room

    def requested(self, node: str) -> CpuMem:
        """The requests of the pods counted on ``node``."""
        return self._requested.get(node, CpuMem())

    def _bump(self, node: str) -> None:
        if self.on_change is not None:
            self.on_change(node)

    def on_node(self, node: Mapping[str, Any]) -> None:
        """A node add/update: its allocatable."""
        name = objects.name(node)
        allocatable = node_allocatable(node)
        if allocatable is None:
            if self._allocatable.pop(name, None) is not None:
                self._bump(name)
        elif self._allocatable.get(name) != allocatable:
            self._allocatable[name] = allocatable
            self._bump(name)

    def on_node_deleted(self, name: str) -> None:
        """Forget a node's allocatable (its pods stay counted until they go)."""
        if self._allocatable.pop(name, None) is not None:
            self._bump(name)

    def _count(self, uid: str, node: str, request: CpuMem, bound: bool) -> None:
        old = self._pods.get(uid)
        if old == (node, request, bound):
            return
        if old is not None:
            self._uncount(uid)
        self._pods[uid] = (node, request, bound)
        self._requested[node] = self._requested.get(node, CpuMem()) + request
        self._bump(node)

    def _uncount(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is None:
            return
        node, request, _ = old
        left = self._requested.get(node, CpuMem()) - request  # pods asking nothing leave no sum
        if left == CpuMem():
            self._requested.pop(node, None)
        else:
            self._requested[node] = left
        self._bump(node)

    def on_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod add/update: counted on its node while bound and not finished."""
        uid = objects.uid(pod)
        spec = pod.get("spec")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if phase in _TERMINAL_PHASES:
            self._uncount(uid)
            return
        if not node:
            return  # unbound: an assumption by the filter (if any) stays
        try:
            request = pod_cpu_mem(pod)
        except InvalidInput as exc:  # kube-scheduler would not have bound it; count nothing
            log.info("pod_requests_unreadable", pod=objects.namespaced_key(pod), error=str(exc))
            request = CpuMem()
        self._count(uid, node, request, True)

    def on_pod_deleted(self, pod: Mapping[str, Any]) -> None:
        """A pod is gone: it no longer counts."""
        self._uncount(objects.uid(pod))

    def assume(self, uid: str, node: str, request: CpuMem) -> Callable[[], None]:
        """Count a pod the filter just placed on ``node`` until it shows up bound; returns the undo."""
        old = self._pods.get(uid)
        if old is not None and old[2]:
            return lambda: None  # bound already: the cache knows better
        self._count(uid, node, request, False)

        def undo() -> None:
            if self._pods.get(uid) == (node, request, False):
                self._uncount(uid)
                if old is not None:
                    self._count(uid, *old)

        return undo

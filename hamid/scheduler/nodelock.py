"""HAMi's node lock (``hami.io/mutex.lock``), compatible with HAMi plugins, without its stalls.

Value ``<RFC3339>,<namespace>,<pod>`` set with a resourceVersion precondition; re-entrant for the
same pod; taken over when expired (``--node-lock-timeout``), when its holder is gone, finished,
already allocated, or headed to another node. A holder that is still Pending and unallocated
keeps the lock until expiry (upstream #3096: two pods swapped memory limits). Contention
*waits* (bounded) for the holder to release, woken by node/pod cache events, instead of failing.
Release is owner-checked (exact namespace and name, never a substring).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model.errors import InvalidInput
from hamid.scheduler.state import SchedulerState

log = get_logger("scheduler.nodelock")

JSON = dict[str, Any]
_RECHECK_S = 1.0


class LockContention(Exception):
    """The node stayed locked by another pod for the whole wait."""


class Holder(enum.Enum):
    """What the lock holder pod is doing, as far as the lock is concerned."""

    ABSENT = "absent"  #: the pod does not exist (any more)
    DONE = "done"  #: finished, deleting, allocated, failed allocation, or headed elsewhere
    PENDING = "pending"  #: still Pending and not yet allocated on this node: keep its lock
    UNKNOWN = "unknown"  #: not known (legacy lock without owner, or cache not synced)


class Decision(enum.Enum):
    """What to do with the current lock value."""

    TAKE = "take"
    OWN = "own"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class LockView:
    """The decision on a lock value and why."""

    decision: Decision
    why: str
    holder: str = ""


def holder_state(pod: JSON | None, node: str, known: bool = True) -> Holder:
    """Classify the holder pod (``None`` = not found; ``known=False`` = cache cannot tell)."""
    if not known:
        return Holder.UNKNOWN
    if pod is None:
        return Holder.ABSENT
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed", "Running"):
        return Holder.DONE
    if annotations.get(ann.BIND_PHASE) in (ann.BIND_PHASE_SUCCESS, ann.BIND_PHASE_FAILED):
        return Holder.DONE
    target = annotations.get(ann.VGPU_NODE)
    if target is not None and target != node:
        return Holder.DONE
    return Holder.PENDING


def decide(
    value: str | None,
    namespace: str,
    name: str,
    now: datetime,
    timeout: timedelta,
    holder_of: Callable[[str, str], Holder],
) -> LockView:
    """Decide on a lock value for pod ``namespace/name`` (pure; ``holder_of(ns, name)`` classifies)."""
    if value is None:
        return LockView(Decision.TAKE, "unlocked")
    try:
        lock = ann.parse_node_lock(value)
    except InvalidInput as exc:
        return LockView(Decision.TAKE, f"malformed lock replaced: {exc}")
    holder = f"{lock.namespace}/{lock.name}" if lock.name is not None else "legacy"
    if lock.namespace == namespace and lock.name == name:
        return LockView(Decision.OWN, "held by this pod", holder)
    if now - lock.time > timeout:
        return LockView(Decision.TAKE, "expired", holder)
    if lock.namespace is None or lock.name is None:
        return LockView(Decision.WAIT, "legacy lock without owner", holder)
    state = holder_of(lock.namespace, lock.name)
    if state in (Holder.ABSENT, Holder.DONE):
        return LockView(Decision.TAKE, f"holder {state.value}", holder)
    return LockView(Decision.WAIT, f"holder {state.value}", holder)


class NodeLocker:
    """Acquire and release HAMi node locks through the API, waiting on cache events."""

    def __init__(
        self,
        kube: KubeClient,
        state: SchedulerState,
        node_of: Callable[[str], JSON | None],
        pod_of: Callable[[str, str], tuple[JSON | None, bool]],
        timeout: timedelta,
        call_timeout: float = 5.0,
    ) -> None:
        self.kube = kube
        self.state = state
        self._node_of = node_of
        self._pod_of = pod_of
        self.timeout = timeout
        self.call_timeout = call_timeout

    def _holder(self, node: str) -> Callable[[str, str], Holder]:
        def classify(namespace: str, name: str) -> Holder:
            pod, known = self._pod_of(namespace, name)
            return holder_state(pod, node, known)

        return classify

    async def acquire(self, node: str, namespace: str, name: str, wait_s: float) -> float:
        """Take the lock of ``node`` for ``namespace/name``, waiting up to ``wait_s``; seconds waited.

        Raises :class:`LockContention` when still held by another pod after ``wait_s``,
        :class:`KubeError` when the node cannot be read or patched.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + wait_s
        fresh: JSON | None = None
        while True:
            async with self.state.node_lock(node):
                obj = fresh or self._node_of(node)
                if obj is None:
                    obj = await self.kube.get_node(node, timeout=self.call_timeout)
                fresh = None
                meta = obj.get("metadata") or {}
                value = (meta.get("annotations") or {}).get(ann.NODE_LOCK)
                view = decide(value, namespace, name, datetime.now(UTC), self.timeout, self._holder(node))
                if view.decision is Decision.OWN:
                    return loop.time() - started
                if view.decision is Decision.TAKE:
                    lock_value = ann.format_node_lock(datetime.now().astimezone(), namespace, name)
                    try:
                        await self.kube.patch_node_metadata(
                            node,
                            annotations={ann.NODE_LOCK: lock_value},
                            resource_version=str(meta.get("resourceVersion") or ""),
                            timeout=self.call_timeout,
                        )
                    except Conflict:
                        fresh = await self.kube.get_node(node, timeout=self.call_timeout)
                        continue
                    if value is not None:
                        log.info("node_lock_taken_over", node=node, why=view.why, previous=view.holder)
                    return loop.time() - started
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LockContention(
                    f"node {node} is locked by {view.holder} ({view.why}); "
                    f"waited {wait_s:g}s: node lock contention"
                )
            await self.state.wait_change(node, min(remaining, _RECHECK_S))

    async def release(self, node: str, namespace: str, name: str, attempts: int = 5) -> bool:
        """Remove the lock if (and only if) ``namespace/name`` holds it; True when removed."""
        for _ in range(attempts):
            try:
                obj = await self.kube.get_node(node, timeout=self.call_timeout)
            except NotFound:
                return False
            meta = obj.get("metadata") or {}
            value = (meta.get("annotations") or {}).get(ann.NODE_LOCK)
            if value is None:
                return False
            try:
                lock = ann.parse_node_lock(value)
            except InvalidInput:
                return False
            if lock.namespace != namespace or lock.name != name:
                return False
            try:
                await self.kube.patch_node_metadata(
                    node,
                    annotations={ann.NODE_LOCK: None},
                    resource_version=str(meta.get("resourceVersion") or ""),
                    timeout=self.call_timeout,
                )
                return True
            except Conflict:
                continue
            except KubeError as exc:
                log.warning("node_lock_release_failed", node=node, pod=f"{namespace}/{name}", error=str(exc))
                return False
        return False

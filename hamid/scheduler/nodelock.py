"""HAMi's node lock (``hami.io/mutex.lock``), compatible with HAMi plugins, without its stalls.

Value ``<RFC3339>,<namespace>,<pod>`` set with a resourceVersion precondition; re-entrant for the
same pod; taken over when its holder is gone, finished, already allocated, or headed to another
node. A holder that is still Pending and unallocated keeps the lock even past its expiry
(``--node-lock-timeout``): handing it over would let the next pod's Allocate be served the
holder's devices (upstream #3096: two pods swapped memory limits). Only past the hard cap
``--node-lock-max-hold`` is it taken from such a holder, with a warning, so a stuck pod cannot
block a node for good — or much sooner, once the holder has made no progress for
:data:`DEFAULT_STALL` (neither it nor the lock changed while a bind waited: a pod bound to a node
whose kubelet never admits it). hamid's plugin serves an Allocate only to the pod the lock names,
so a holder that wakes up later is refused, never handed another pod's devices. A legacy lock
without an owner is taken once expired. Contention *waits* (bounded) for the holder to release,
woken by node/pod cache events, instead of failing.
Release is owner-checked (exact namespace and name, never a substring).
"""

from __future__ import annotations

import asyncio
import enum
import time
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
#: ``--node-lock-max-hold``: how long a Pending, unallocated holder may keep a node lock at most.
DEFAULT_MAX_HOLD = timedelta(minutes=30)
#: A Pending holder whose pod and lock stayed unchanged this long while a bind waited loses the
#: lock (shorter than a bind's wait, so the waiting bind itself takes it over).
DEFAULT_STALL = timedelta(seconds=20)
#: The shortest timeout an API call of an acquisition or release gets near the end of its budget.
_MIN_CALL_S = 0.5


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
    #: Taken from a holder that may still need it (past ``--node-lock-max-hold``): log a warning.
    forced: bool = False


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
    max_hold: timedelta = DEFAULT_MAX_HOLD,
    quiet_for: timedelta = timedelta(0),
    stall: timedelta | None = None,
) -> LockView:
    """Decide on a lock value for pod ``namespace/name`` (pure; ``holder_of(ns, name)`` classifies).

    The holder's state comes before the lock's age: a Pending, unallocated (or unknown) holder
    keeps it past ``timeout`` until ``max_hold`` — unless it is Pending and has shown no progress
    for ``quiet_for`` ≥ ``stall`` (holder pod and lock value unchanged while watched).
    """
    if value is None:
        return LockView(Decision.TAKE, "unlocked")
    try:
        lock = ann.parse_node_lock(value)
    except InvalidInput as exc:
        return LockView(Decision.TAKE, f"malformed lock replaced: {exc}")
    holder = f"{lock.namespace}/{lock.name}" if lock.name is not None else "legacy"
    if lock.namespace == namespace and lock.name == name:
        return LockView(Decision.OWN, "held by this pod", holder)
    age = now - lock.time
    if lock.namespace is None or lock.name is None:
        if age > timeout:
            return LockView(Decision.TAKE, "expired", holder)
        return LockView(Decision.WAIT, "legacy lock without owner", holder)
    state = holder_of(lock.namespace, lock.name)
    if state in (Holder.ABSENT, Holder.DONE):
        return LockView(Decision.TAKE, f"holder {state.value}", holder)
    if age > max_hold:
        why = f"holder still {state.value} after {age}, past --node-lock-max-hold {max_hold}"
        return LockView(Decision.TAKE, why, holder, forced=True)
    if state is Holder.PENDING and stall is not None and quiet_for >= stall:
        why = f"holder made no progress for {quiet_for} (its kubelet has not admitted it)"
        return LockView(Decision.TAKE, why, holder, forced=True)
    if age > timeout:
        why = f"holder {state.value}: kept past --node-lock-timeout until --node-lock-max-hold"
        return LockView(Decision.WAIT, why, holder)
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
        max_hold: timedelta = DEFAULT_MAX_HOLD,
        stall: timedelta | None = DEFAULT_STALL,
    ) -> None:
        self.kube = kube
        self.state = state
        self._node_of = node_of
        self._pod_of = pod_of
        self.timeout = timeout
        self.max_hold = max_hold
        self.stall = stall
        self.call_timeout = call_timeout
        #: node -> (lock value, holder resourceVersion, monotonic time both were first seen).
        self._watched: dict[str, tuple[str, str, float]] = {}

    def _quiet_for(self, node: str, value: str | None) -> timedelta:
        """How long the lock value and its holder pod have stayed unchanged as watched from here."""
        lock = None
        if value is not None:
            try:
                lock = ann.parse_node_lock(value)
            except InvalidInput:
                lock = None
        if value is None or lock is None or lock.namespace is None or lock.name is None:
            self._watched.pop(node, None)
            return timedelta(0)
        pod, _known = self._pod_of(lock.namespace, lock.name)
        version = str(((pod or {}).get("metadata") or {}).get("resourceVersion") or "")
        now = time.monotonic()
        seen = self._watched.get(node)
        if seen is None or seen[:2] != (value, version):
            self._watched[node] = (value, version, now)
            return timedelta(0)
        return timedelta(seconds=now - seen[2])

    def _holder(self, node: str) -> Callable[[str, str], Holder]:
        def classify(namespace: str, name: str) -> Holder:
            pod, known = self._pod_of(namespace, name)
            return holder_state(pod, node, known)

        return classify

    def _call_timeout(self, deadline: float | None) -> float:
        """An API call's timeout: ``call_timeout``, shortened near ``deadline`` (loop time)."""
        if deadline is None:
            return self.call_timeout
        remaining = deadline - asyncio.get_running_loop().time()
        return max(min(self.call_timeout, remaining), _MIN_CALL_S)

    async def acquire(self, node: str, namespace: str, name: str, wait_s: float) -> float:
        """Take the lock of ``node`` for ``namespace/name``, waiting up to ``wait_s``; seconds waited.

        Raises :class:`LockContention` when still held by another pod after ``wait_s``,
        :class:`KubeError` when the node cannot be read or patched. API calls are bounded so the
        whole acquisition ends close to ``wait_s``.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + wait_s
        fresh: JSON | None = None
        while True:
            async with self.state.node_lock(node):
                obj = fresh or self._node_of(node)
                if obj is None:
                    obj = await self.kube.get_node(node, timeout=self._call_timeout(deadline))
                fresh = None
                meta = obj.get("metadata") or {}
                value = (meta.get("annotations") or {}).get(ann.NODE_LOCK)
                view = decide(
                    value,
                    namespace,
                    name,
                    datetime.now(UTC),
                    self.timeout,
                    self._holder(node),
                    self.max_hold,
                    self._quiet_for(node, value),
                    self.stall,
                )
                if view.decision is Decision.OWN:
                    return loop.time() - started
                if view.decision is Decision.TAKE:
                    lock_value = ann.format_node_lock(datetime.now().astimezone(), namespace, name)
                    try:
                        await self.kube.patch_node_metadata(
                            node,
                            annotations={ann.NODE_LOCK: lock_value},
                            resource_version=str(meta.get("resourceVersion") or ""),
                            timeout=self._call_timeout(deadline),
                        )
                    except Conflict:
                        if loop.time() >= deadline:
                            raise LockContention(
                                f"node {node}: the lock kept changing for {wait_s:g}s: node lock contention"
                            ) from None
                        fresh = await self.kube.get_node(node, timeout=self._call_timeout(deadline))
                        continue
                    if view.forced:
                        log.warning(
                            "node_lock_taken_from_pending_holder",
                            node=node,
                            why=view.why,
                            previous=view.holder,
                        )
                    elif value is not None:
                        log.info("node_lock_taken_over", node=node, why=view.why, previous=view.holder)
                    return loop.time() - started
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LockContention(
                    f"node {node} is locked by {view.holder} ({view.why}); "
                    f"waited {wait_s:g}s: node lock contention"
                )
            await self.state.wait_change(node, min(remaining, _RECHECK_S))

    async def release(
        self, node: str, namespace: str, name: str, attempts: int = 5, deadline: float | None = None
    ) -> bool:
        """Remove the lock if (and only if) ``namespace/name`` holds it; True when removed.

        Never raises for an API failure: it is logged and False returned (the lock then expires,
        or its holder's next bind retry takes it again as its own). ``deadline`` (loop time)
        shortens the API calls.
        """
        pod = f"{namespace}/{name}"
        for _ in range(attempts):
            try:
                obj = await self.kube.get_node(node, timeout=self._call_timeout(deadline))
            except NotFound:
                return False
            except KubeError as exc:
                log.warning("node_lock_release_failed", node=node, pod=pod, error=str(exc))
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
                    timeout=self._call_timeout(deadline),
                )
                return True
            except Conflict:
                continue
            except KubeError as exc:
                log.warning("node_lock_release_failed", node=node, pod=pod, error=str(exc))
                return False
        return False

"""HAMi's node lock (``hami.io/mutex.lock``), compatible with HAMi plugins, without its stalls.

The protocol (value, ownership, the take-over rules) is :mod:`hamid.model.nodelock`; this is the
scheduler's side of it: binds take the lock through the API with a resourceVersion precondition,
re-entrant for the same pod; taken over when its holder is gone, finished, already allocated, or
headed to another node. A holder that is still Pending and unallocated keeps the lock even past its
expiry (``--node-lock-timeout``): handing it over would let the next pod's Allocate be served the
holder's devices (upstream #3096: two pods swapped memory limits). Only past the hard cap
``--node-lock-max-hold`` is it taken from such a holder, with a warning, so a stuck pod cannot
block a node for good — or much sooner, once the holder has made no progress for
:data:`DEFAULT_STALL` (neither it nor the lock changed while a bind waited: a pod bound to a node
whose kubelet never admits it). hamid's plugin serves an Allocate only to the pod the lock names,
and while the holder it was taken from still waits unadmitted it serves neither (kubelet may be
admitting either: the new holder's devices went to the old one until an outside race hunt), unless
kubelet's GPUs are the new holder's entry alone. A legacy lock
without an owner is taken once expired. Release is owner-checked (exact namespace and name).

Contention *waits* (bounded) instead of failing, in line: this process's binds for one node queue
in arrival order and only the first looks at the lock, woken by node/pod cache events; the value
this process last wrote or read is used until the node cache has caught up with it. So a release
costs one PATCH by the next bind in line, not a conflicting PATCH and a GET by every waiting bind
(the API calls per bound pod stay constant in the burst size, docs/reliability.md §3). The line is
only an optimisation: every take is still guarded by the Node's resourceVersion, so other
schedulers and HAMi plugins holding the same lock stay correct.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound
from hamid.log import get_logger
from hamid.model import nodelock as protocol
from hamid.model import objects
from hamid.model.annotations import parse_node_lock
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, Node, NodeBody, Pod
from hamid.model.nodelock import DEFAULT_MAX_HOLD, Decision, Holder, LockView, decide, holder_state
from hamid.scheduler.ledger import Ledger

__all__ = [
    "DEFAULT_MAX_HOLD",
    "DEFAULT_STALL",
    "Decision",
    "Holder",
    "LockContention",
    "LockView",
    "NodeLocker",
    "decide",
    "holder_state",
]

log = get_logger("scheduler.nodelock")

_RECHECK_S = 1.0
#: A Pending holder whose pod and lock stayed unchanged this long while a bind waited loses the
#: lock (shorter than a bind's wait, so the waiting bind itself takes it over).
DEFAULT_STALL = timedelta(seconds=20)
#: The shortest timeout an API call of an acquisition or release gets near the end of its budget.
_MIN_CALL_S = 0.5


class LockContention(Exception):
    """The node stayed locked by another pod for the whole wait."""


@dataclass(frozen=True, slots=True)
class _Seen:
    """The lock value of a node at one resourceVersion (what a take's precondition needs)."""

    value: str | None
    version: str

    @classmethod
    def of(cls, node: NodeBody) -> _Seen:
        return cls(protocol.lock_value(node), objects.resource_version(node))


class NodeLocker:
    """Acquire and release HAMi node locks through the API, one bind per node at a time."""

    def __init__(
        self,
        kube: KubeClient,
        ledger: Ledger,
        node_of: Callable[[str], Node | None],
        pod_of: Callable[[str, str], tuple[Pod | None, bool]],
        timeout: timedelta,
        call_timeout: float = 5.0,
        max_hold: timedelta = DEFAULT_MAX_HOLD,
        stall: timedelta | None = DEFAULT_STALL,
    ) -> None:
        self.kube = kube
        self.ledger = ledger
        self._node_of = node_of
        self._pod_of = pod_of
        self.timeout = timeout
        self.max_hold = max_hold
        self.stall = stall
        self.call_timeout = call_timeout
        #: node -> (lock value, holder resourceVersion, monotonic time both were first seen).
        self._watched: dict[str, tuple[str, str, float]] = {}
        #: node -> this process's binds waiting for its lock, first in line first.
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}
        #: node -> the lock as this process last wrote or read it, newer than the node cache.
        self._seen: dict[str, _Seen] = {}

    def waiting(self, node: str) -> int:
        """How many binds of this process are in line for ``node``'s lock (the first included)."""
        return len(self._lines.get(node, ()))

    def _quiet_for(self, node: str, value: str | None) -> timedelta:
        """How long the lock value and its holder pod have stayed unchanged as watched from here."""
        lock = None
        if value is not None:
            try:
                lock = parse_node_lock(value)
            except InvalidInput:
                lock = None
        if value is None or lock is None or lock.namespace is None or lock.name is None:
            self._watched.pop(node, None)
            return timedelta(0)
        pod, _known = self._pod_of(lock.namespace, lock.name)
        version = objects.resource_version(pod)
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

    # -- what the lock is now -------------------------------------------------------------------

    def _remember(self, node: str, obj: JSON) -> _Seen:
        """Keep the lock as an API answer showed it, until the node cache has caught up."""
        seen = self._seen[node] = _Seen.of(obj)
        return seen

    def _latest(self, node: str) -> _Seen | None:
        """The newest lock known here: the node cache, or what this process wrote or read since.

        Versions that cannot be ordered leave the cache in charge (a take then conflicts and reads).
        """
        cached = self._node_of(node)
        ours = self._seen.get(node)
        if ours is None:
            return None if cached is None else _Seen.of(cached)
        caught_up = objects.version_at_least(objects.resource_version(cached), ours.version) is not False
        if cached is not None and caught_up:
            del self._seen[node]
            return _Seen.of(cached)
        return ours

    def value(self, node: str) -> str | None:
        """The lock value of ``node`` as last known here (a take of this process until the node
        cache has caught up with it; None: unlocked or not known)."""
        seen = self._latest(node)
        return None if seen is None else seen.value

    def _view(self, node: str, seen: _Seen, namespace: str, name: str) -> LockView:
        return decide(
            seen.value,
            namespace,
            name,
            datetime.now(UTC),
            self.timeout,
            self._holder(node),
            self.max_hold,
            self._quiet_for(node, seen.value),
            self.stall,
        )

    # -- acquire --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _turn(self, node: str, deadline: float, wait_s: float) -> AsyncIterator[None]:
        """Wait until this bind is first in ``node``'s line (FIFO); hand the turn on when done."""
        line = self._lines.setdefault(node, deque())
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ahead = len(line)
        line.append(ticket)
        if not ahead:
            ticket.set_result(None)
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    await ticket
            except TimeoutError:
                raise LockContention(
                    f"node {node}: {ahead} binds were ahead in line for its lock; "
                    f"waited {wait_s:g}s: node lock contention"
                ) from None
            yield
        finally:
            first = line[0] is ticket
            line.remove(ticket)
            if not line:
                self._lines.pop(node, None)
            elif first and not line[0].done():
                line[0].set_result(None)

    async def acquire(
        self, node: str, namespace: str, name: str, wait_s: float, fenced: Callable[[], str] = lambda: ""
    ) -> float:
        """Take the lock of ``node`` for ``namespace/name``, waiting up to ``wait_s``; seconds waited.

        Raises :class:`LockContention` when still held by another pod after ``wait_s``, or when
        ``fenced()`` says (non-empty) that this replica's term ended while it waited: it is asked
        right before the take, so a replica that lost its lease writes no lock;
        :class:`KubeError` when the node cannot be read or patched. API calls are bounded so the
        whole acquisition ends close to ``wait_s``. A pod that holds the lock already does not
        queue (a replayed bind).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + wait_s
        seen = self._latest(node)
        if seen is not None and self._view(node, seen, namespace, name).decision is Decision.OWN:
            return 0.0
        async with self._turn(node, deadline, wait_s):
            while True:
                view = await self._attempt(node, namespace, name, deadline, wait_s, fenced)
                if view is None:
                    return loop.time() - started
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise LockContention(
                        f"node {node} is locked by {view.holder} ({view.why}); "
                        f"waited {wait_s:g}s: node lock contention"
                    )
                await self.ledger.wait_change(node, min(remaining, _RECHECK_S))

    async def _attempt(
        self, node: str, namespace: str, name: str, deadline: float, wait_s: float, fenced: Callable[[], str]
    ) -> LockView | None:
        """Look at the lock and take it when free (re-read on a conflict); None once this pod holds it."""
        loop = asyncio.get_running_loop()
        async with self.ledger.node_guard(node):
            seen = self._latest(node)
            while True:
                if seen is None:
                    seen = self._remember(
                        node, await self.kube.get_node(node, timeout=self._call_timeout(deadline))
                    )
                view = self._view(node, seen, namespace, name)
                if view.decision is Decision.OWN:
                    return None
                if view.decision is Decision.WAIT:
                    return view
                reason = fenced()
                if reason:
                    raise LockContention(f"node {node}: lock not taken: {reason}")
                try:
                    taken = await self.kube.patch_node_metadata(
                        node,
                        annotations=protocol.take_annotations(datetime.now().astimezone(), namespace, name),
                        resource_version=seen.version,
                        timeout=self._call_timeout(deadline),
                    )
                except Conflict:
                    if loop.time() >= deadline:
                        raise LockContention(
                            f"node {node}: the lock kept changing for {wait_s:g}s: node lock contention"
                        ) from None
                    seen = None
                    continue
                self._remember(node, taken)
                self._log_take(node, view, seen.value)
                return None

    @staticmethod
    def _log_take(node: str, view: LockView, previous: str | None) -> None:
        if view.forced:
            log.warning("node_lock_taken_from_pending_holder", node=node, why=view.why, previous=view.holder)
        elif previous is not None:
            log.info("node_lock_taken_over", node=node, why=view.why, previous=view.holder)

    # -- release --------------------------------------------------------------------------------

    async def release(
        self, node: str, namespace: str, name: str, attempts: int = 5, deadline: float | None = None
    ) -> bool:
        """Remove the lock if (and only if) ``namespace/name`` holds it; True when removed.

        Reads the node first (a release is rare: a failed bind's undo). Never raises for an API
        failure: it is logged and False returned (the lock then expires, or its holder's next bind
        retry takes it again as its own). ``deadline`` (loop time) shortens the API calls.
        """
        pod = f"{namespace}/{name}"
        for _ in range(attempts):
            try:
                obj = await self.kube.get_node(node, timeout=self._call_timeout(deadline))
                try:
                    lock = protocol.read_lock(obj)
                except InvalidInput:
                    return False
                if not protocol.held_by(lock, namespace, name):
                    return False
                released = await self.kube.patch_node_metadata(
                    node,
                    annotations=protocol.release_annotations(),
                    resource_version=objects.resource_version(obj),
                    timeout=self._call_timeout(deadline),
                )
            except NotFound:
                return False
            except Conflict:
                continue
            except KubeError as exc:
                log.warning("node_lock_release_failed", node=node, pod=pod, error=str(exc))
                return False
            self._remember(node, released)
            return True
        return False

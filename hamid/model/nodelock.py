"""HAMi's node-lock protocol (``hami.io/mutex.lock`` on the Node), one definition for both sides.

The scheduler's bind takes the lock for the pod it binds; the device plugin's Allocate (or the
bind's undo) releases it once that pod is served. The value is ``<RFC3339>,<namespace>,<pod>``
(the codec lives with HAMi's other annotations: :func:`~hamid.model.annotations.format_node_lock`,
:func:`~hamid.model.annotations.parse_node_lock`); every write is guarded by the Node's
resourceVersion, so HAMi's own scheduler and plugins can share a node with hamid. This module says
who holds a lock, what taking and releasing write, and whether a waiting pod may take it
(:func:`decide`: the holder's state before the lock's age, upstream #3096). Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.annotations import (
    DEVICES_LISTED_FOR,
    NODE_LOCK,
    NodeLock,
    format_node_lock,
    parse_node_lock,
)
from hamid.model.errors import InvalidInput

#: ``--node-lock-max-hold``: how long a Pending, unallocated holder may keep a node lock at most.
DEFAULT_MAX_HOLD = timedelta(minutes=30)


def lock_value(node: Mapping[str, Any] | None) -> str | None:
    """The raw lock annotation of a Node object (None: unlocked)."""
    value = objects.annotations(node).get(NODE_LOCK)
    return value if value else None


def read_lock(node: Mapping[str, Any] | None) -> NodeLock | None:
    """The parsed lock of a Node object (None: unlocked); :class:`InvalidInput` when malformed."""
    value = lock_value(node)
    return None if value is None else parse_node_lock(value)


def holder_key(lock: NodeLock) -> str | None:
    """``namespace/name`` of the pod a lock names (None for the legacy form without an owner)."""
    if lock.namespace is None or lock.name is None:
        return None
    return f"{lock.namespace}/{lock.name}"


def held_by(lock: NodeLock | None, namespace: str, name: str) -> bool:
    """Whether the lock names exactly pod ``namespace/name`` (never a prefix match, upstream #1433)."""
    return lock is not None and lock.namespace == namespace and lock.name == name


def expired(lock: NodeLock, now: datetime, timeout: timedelta) -> bool:
    """Whether the lock is older than ``timeout`` (``--node-lock-timeout``)."""
    return now - lock.time > timeout


def take_annotations(now: datetime, namespace: str, name: str) -> dict[str, str | None]:
    """What taking the lock for ``namespace/name`` writes (``now`` aware; HAMi writes local time).

    A take also removes the plugin's acknowledgement of an earlier take (``steer``): lock values
    have whole seconds, so a take repeated within the second would otherwise find it already there.
    """
    return {NODE_LOCK: format_node_lock(now, namespace, name), DEVICES_LISTED_FOR: None}


def release_annotations() -> dict[str, str | None]:
    """What releasing the lock writes: the annotation removed."""
    return {NODE_LOCK: None}


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


def holder_state(pod: Mapping[str, Any] | None, node: str, known: bool = True) -> Holder:
    """Classify the holder pod (``None`` = not found; ``known=False`` = cache cannot tell)."""
    if not known:
        return Holder.UNKNOWN
    if pod is None:
        return Holder.ABSENT
    notes = objects.annotations(pod)
    phase = objects.section(pod, "status").get("phase")
    if objects.metadata(pod).get("deletionTimestamp") or phase in ("Succeeded", "Failed", "Running"):
        return Holder.DONE
    if notes.get(ann.BIND_PHASE) in (ann.BIND_PHASE_SUCCESS, ann.BIND_PHASE_FAILED):
        return Holder.DONE
    target = notes.get(ann.VGPU_NODE)
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
    """Decide on a lock value for pod ``namespace/name`` (``holder_of(ns, name)`` classifies).

    The holder's state comes before the lock's age: a Pending, unallocated (or unknown) holder
    keeps it past ``timeout`` until ``max_hold`` — unless it is Pending and has shown no progress
    for ``quiet_for`` ≥ ``stall`` (holder pod and lock value unchanged while watched).
    """
    if value is None:
        return LockView(Decision.TAKE, "unlocked")
    try:
        lock = parse_node_lock(value)
    except InvalidInput as exc:
        return LockView(Decision.TAKE, f"malformed lock replaced: {exc}")
    holder = holder_key(lock)
    if held_by(lock, namespace, name):
        return LockView(Decision.OWN, "held by this pod", holder or "")
    if lock.namespace is None or lock.name is None:
        if expired(lock, now, timeout):
            return LockView(Decision.TAKE, "expired", "legacy")
        return LockView(Decision.WAIT, "legacy lock without owner", "legacy")
    state = holder_of(lock.namespace, lock.name)
    who = holder or ""
    if state in (Holder.ABSENT, Holder.DONE):
        return LockView(Decision.TAKE, f"holder {state.value}", who)
    age = now - lock.time
    if age > max_hold:
        why = f"holder still {state.value} after {age}, past --node-lock-max-hold {max_hold}"
        return LockView(Decision.TAKE, why, who, forced=True)
    if state is Holder.PENDING and stall is not None and quiet_for >= stall:
        why = f"holder made no progress for {quiet_for} (its kubelet has not admitted it)"
        return LockView(Decision.TAKE, why, who, forced=True)
    if expired(lock, now, timeout):
        why = f"holder {state.value}: kept past --node-lock-timeout until --node-lock-max-hold"
        return LockView(Decision.WAIT, why, who)
    return LockView(Decision.WAIT, f"holder {state.value}", who)

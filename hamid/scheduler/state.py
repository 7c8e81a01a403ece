"""The scheduler's in-memory state: GPU inventory, reservations keyed by pod UID, quotas.

Owned by the event loop: every mutation is synchronous (between awaits). Operations that must
await the API (filter patch, bind, refit) make a tentative in-memory change first and keep the
returned :data:`Undo` to roll it back on failure; those that must keep a node's plan stable
across an await take :meth:`SchedulerState.node_lock` (per node, never process-wide), so a slow
API server never stalls other nodes.

Accounting is incremental: pod add/update/delete events adjust per-device usage of one node; a
rebuild from a fresh list in any order gives the same usage (see :meth:`snapshot`), which the
periodic reconcile (:mod:`hamid.scheduler.reconcile`) checks and repairs. Nodes are
kept ordered by node score the same way (:class:`ScoreIndex`), so a filter walks them best-first.
The scheduler's pod cache keeps pods trimmed to what is read here (:func:`trim_scheduler_pod`).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hamid.fit.fit import Quota, pod_quota_usage, quota_limits
from hamid.fit.usage import (
    ContainerKind,
    DeviceAmount,
    NodeUsage,
    allocation_refusal,
    container_kinds,
    effective_pod_usage,
    init_containers_succeeded,
)
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model.devices import DeviceInfo, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.objects import newer_than
from hamid.model.quantity import quantity_as_int
from hamid.model.resources import ResourceConfig, pod_requests
from hamid.scheduler.webhook import DEFAULT_SCHEDULER

log = get_logger("scheduler.state")

JSON = dict[str, Any]
#: Rolls back one tentative change; calling it twice, or after the pod is gone, is a no-op.
Undo = Callable[[], None]

#: A handshake ``Requesting_<t>`` younger than this keeps the node healthy (HAMi: 60 s).
HANDSHAKE_GRACE_S = 60.0
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_DELETED_MEMORY = 10_000


#: Every annotation key hamid defines (``hami.io/…``, ``nvidia.com/…``): the pod annotations the
#: scheduler can read. Others (``kubectl.kubernetes.io/last-applied-configuration`` — a copy of the
#: whole spec —, tooling notes) stay out of its pod cache.
HAMID_ANNOTATION_KEYS = frozenset(
    value for name, value in vars(ann).items() if name.isupper() and isinstance(value, str) and "/" in value
)
_POD_METADATA_KEYS = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
_CONTAINER_KEYS = ("name", "resources", "restartPolicy")


def _trim_containers(containers: Any) -> Any:
    if not isinstance(containers, list):
        return containers  # malformed: kept as is, so the reader reports it
    return [{k: c[k] for k in _CONTAINER_KEYS if k in c} if isinstance(c, dict) else c for c in containers]


def _trim_init_statuses(statuses: Any) -> Any:
    """Name and ``state.terminated.exitCode`` of each init container status (what init release reads)."""
    if not isinstance(statuses, list):
        return statuses
    out = []
    for status in statuses:
        if not isinstance(status, dict):
            out.append(status)
            continue
        kept: JSON = {"name": status.get("name")}
        terminated = (status.get("state") or {}).get("terminated")
        if isinstance(terminated, dict):
            kept["state"] = {"terminated": {"exitCode": terminated.get("exitCode")}}
        out.append(kept)
    return out


def trim_scheduler_pod(pod: JSON) -> JSON:
    """The fields of a pod the scheduler reads, for its pod cache (a new dict; ``pod`` unchanged).

    metadata: name, namespace, uid, resourceVersion, labels, deletionTimestamp and hamid's own
    annotations; spec: nodeName, schedulerName and each (init) container's name, resources and
    restartPolicy; status: phase and each init container's name and exit code. Accounting,
    bind, the node lock, refit and Events read nothing else, and a rebuild from trimmed pods
    equals one from full pods. Env, volumes, probes, images, managedFields, conditions and the
    app containers' statuses — most of a pod's bytes — are dropped.
    """
    meta = pod.get("metadata") or {}
    out_meta: JSON = {k: meta[k] for k in _POD_METADATA_KEYS if k in meta}
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        out_meta["annotations"] = {k: v for k, v in annotations.items() if k in HAMID_ANNOTATION_KEYS}
    out: JSON = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    out["metadata"] = out_meta
    spec = pod.get("spec")
    if isinstance(spec, dict):
        out_spec: JSON = {k: spec[k] for k in ("nodeName", "schedulerName") if k in spec}
        for key in ("initContainers", "containers"):
            if key in spec:
                out_spec[key] = _trim_containers(spec[key])
        out["spec"] = out_spec
    status = pod.get("status")
    if isinstance(status, dict):
        out_status: JSON = {k: status[k] for k in ("phase",) if k in status}
        if "initContainerStatuses" in status:
            out_status["initContainerStatuses"] = _trim_init_statuses(status["initContainerStatuses"])
        out["status"] = out_status
    return out


def _noop() -> None:
    """An undo with nothing to roll back."""


@dataclass(slots=True)
class Reservation:
    """What one pod books: its node, positional allocation and the usage applied to that node.

    ``pending`` is True while the filter's annotation patch is in flight. ``blocked`` marks an
    allocation that could not be decoded on a live pod: its devices are booked as full.
    ``version`` is the pod resourceVersion it was last derived from ("" for the filter's own).
    """

    uid: str
    namespace: str
    name: str
    node: str
    layout: PodDevices
    kinds: tuple[ContainerKind, ...]
    init_released: bool
    raw: str
    pending: bool = False
    blocked: frozenset[str] | None = None
    applied: dict[str, DeviceAmount] = field(default_factory=dict)
    version: str = ""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(slots=True, eq=False)
class Hold:
    """Usage booked for pod ``uid`` beyond its reservation while a write about it is undecided.

    A refit books the pod's old GPUs (``amounts`` on ``node``) and the larger of its old and new
    quota usage (``mem``/``cores`` more on ``namespace``) until its patch is decided. ``after``
    is None while the refit decides itself; once set, the first pod event newer than that
    resourceVersion (or the pod's delete, or a reconcile list newer than it) decides instead.
    """

    uid: str
    node: str
    amounts: dict[str, DeviceAmount]
    namespace: str
    mem: int
    cores: int
    after: str | None = None
    applied: dict[str, DeviceAmount] = field(default_factory=dict)


@dataclass(slots=True)
class NodeEntry:
    """One registered node: its devices with live usage and the health signals."""

    name: str
    usage: NodeUsage
    infos: tuple[DeviceInfo, ...]
    register_raw: str
    score_raw: str
    cordon_raw: str
    node: JSON
    handshake_at: float | None
    allocatable_gpu: int

    def healthy(self, now: float) -> bool:
        """HAMi's handshake rule (docs/hami-wire.md §2.5) without its dead ends.

        Healthy while ``Requesting_<t>`` is younger than 60 s (or absent / not yet written, or in
        the future: clock skew), afterwards iff the node advertises ``nvidia.com/gpu``. A plugin
        that (re)advertises its GPUs makes the node schedulable again on its own.
        """
        if self.handshake_at is None or now - self.handshake_at < HANDSHAKE_GRACE_S:
            return True
        return self.allocatable_gpu > 0


class ScoreIndex:
    """Registered nodes ordered by node score, kept incrementally.

    A node whose usage changes is only marked (:meth:`touch`, the ``NodeUsage.on_change`` hook);
    :meth:`ranked` re-keys the marked nodes (a bisect and a list move each) and returns the
    ``(score, name)`` pairs ascending, so a filter walks nodes best-first without scoring or
    sorting every candidate.
    """

    __slots__ = ("_dirty", "_keys", "_score")

    def __init__(self) -> None:
        self._keys: list[tuple[float, str]] = []
        self._score: dict[str, float] = {}
        self._dirty: set[str] = set()

    def touch(self, name: str) -> None:
        """Mark ``name`` for re-keying (its usage changed, or it was added or dropped)."""
        self._dirty.add(name)

    def ranked(self, nodes: Mapping[str, NodeEntry]) -> list[tuple[float, str]]:
        """``(score, name)`` of every node in ``nodes``, ascending (the live list: do not mutate)."""
        keys = self._keys
        for name in self._dirty:
            old = self._score.pop(name, None)
            if old is not None:
                del keys[bisect.bisect_left(keys, (old, name))]
            entry = nodes.get(name)
            if entry is not None:
                score = entry.usage.score()
                self._score[name] = score
                bisect.insort(keys, (score, name))
        self._dirty.clear()
        return keys


def pod_uid(pod: Mapping[str, Any]) -> str:
    """``metadata.uid`` of a pod dict."""
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod dict."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def booking_refusal(state: SchedulerState, pod: JSON, node: str, layout: PodDevices | None) -> str:
    """Why pod's allocation annotations must not be booked on ``node`` ("" to book them).

    The annotations are the pod's own word (a tenant can write them), so they are booked only
    for a pod that requests the GPUs, runs (if bound) on the node they name, is this
    scheduler's (or the default scheduler's, whose pods the webhook hands to this one) or was
    placed by it, and whose allocation (``layout``; None when undecodable) its requests and the
    node's register confirm (:func:`~hamid.fit.usage.allocation_refusal`).
    """
    raw_spec = pod.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    bound = spec.get("nodeName")
    if bound and bound != node:
        return f"the pod runs on node {bound}, its {ann.VGPU_NODE} names {node}"
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    ours = state.scheduler_name
    if ours and scheduler not in (ours, DEFAULT_SCHEDULER) and pod_uid(pod) not in state.placed:
        return f"the pod is scheduled by {scheduler!r}, which is not {ours!r}"
    try:
        requests = pod_requests(pod, state.config)
    except InvalidInput as exc:
        return f"its requests cannot be read: {exc}"
    if layout is None:
        return "" if any(r is not None for r in requests) else "the pod requests no GPU"
    entry = state.nodes.get(node)
    return allocation_refusal(layout, requests, entry.usage.by_id if entry is not None else None)


class SchedulerState:
    """Inventory, reservations and quotas of one scheduler process (event-loop owned)."""

    def __init__(
        self,
        config: ResourceConfig | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_name: str = "",
    ) -> None:
        self.config = config or ResourceConfig()
        self.clock = clock
        #: The scheduler's name: a pod of another scheduler is booked only if this one placed it.
        self.scheduler_name = scheduler_name
        #: UIDs of the pods this process reserved (its own record; forgotten on delete).
        self.placed: set[str] = set()
        self.nodes: dict[str, NodeEntry] = {}
        #: Bumped whenever a node name joins or leaves :attr:`nodes` (caches keyed on the set).
        self.membership = 0
        self._index = ScoreIndex()
        self._reservations: dict[str, Reservation] = {}
        self._by_node: dict[str, set[str]] = {}
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._quota_objects: dict[str, dict[str, tuple[int | None, int | None]]] = {}
        self._quota_used: dict[str, list[int]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._holds: dict[str, list[Hold]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.undecodable: list[tuple[JSON, str]] = []
        #: Pods whose allocation annotations were not booked, with why (reported as Events).
        self.refused: list[tuple[JSON, str]] = []
        self._refused_values: dict[str, tuple[str, str]] = {}
        self.handshake_wanted: set[str] = set()
        #: Bumped by every reservation change; :meth:`changed_since` compares against it.
        self.seq = 0
        self._touched: dict[str, int] = {}
        #: A throwaway copy (the reconcile's shadow): no warnings about what it is fed.
        self.quiet = False

    # -- per-node coordination ----------------------------------------------------------------

    def node_lock(self, node: str) -> asyncio.Lock:
        """The in-process lock of ``node`` (hold it across an await that must keep the plan)."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    def node_busy(self, node: str) -> bool:
        """Whether a refit or node-lock acquisition holds the node's lock, or a hold is booked on it."""
        lock = self._locks.get(node)
        if lock is not None and lock.locked():
            return True
        return any(h.node == node for holds in self._holds.values() for h in holds)

    def notify(self, node: str) -> None:
        """Wake every :meth:`wait_change` waiter of ``node``."""
        for fut in self._waiters.pop(node, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_change(self, node: str, max_wait: float) -> bool:
        """Wait until the node (or a pod placed on it) changes; False when ``max_wait`` s passed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(node, set()).add(fut)
        try:
            async with asyncio.timeout(max(max_wait, 0.0)):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(node)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(node, None)

    # -- inventory ------------------------------------------------------------------------------

    def on_node(self, node: JSON) -> None:
        """Apply a node add/update: inventory, cordon, pair scores, handshake and allocatable."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        register_raw = annotations.get(ann.NODE_REGISTER)
        entry = self.nodes.get(name)
        if register_raw is None:
            if entry is not None:
                log.info("node_unregistered", node=name)
                self._drop_node(name)
            self.notify(name)
            return
        score_raw = annotations.get(ann.NODE_SCORE, "")
        cordon_raw = annotations.get(ann.DEVICE_CORDON, "")
        allocatable = self._allocatable(node)
        handshake_at, wants_handshake = self._handshake(annotations.get(ann.NODE_HANDSHAKE))
        if wants_handshake:
            self.handshake_wanted.add(name)
        else:
            self.handshake_wanted.discard(name)
        if (
            entry is not None
            and entry.register_raw == register_raw
            and entry.score_raw == score_raw
            and entry.cordon_raw == cordon_raw
        ):
            entry.node, entry.handshake_at, entry.allocatable_gpu = node, handshake_at, allocatable
            self.notify(name)
            return
        try:
            infos = tuple(ann.decode_node_devices(register_raw))
            pair_scores = ann.decode_pair_scores(score_raw) if score_raw else {}
            cordoned = ann.parse_uuid_list(cordon_raw, ann.DEVICE_CORDON) if cordon_raw else ()
        except InvalidInput as exc:
            log.warning("node_register_invalid", node=name, error=str(exc))
            if entry is not None:
                entry.node, entry.handshake_at, entry.allocatable_gpu = node, handshake_at, allocatable
            self.notify(name)
            return
        usage = self._fresh_usage(name, infos, pair_scores, cordoned or ())
        new_entry = NodeEntry(
            name, usage, infos, register_raw, score_raw, cordon_raw, node, handshake_at, allocatable
        )
        if name not in self.nodes:
            self.membership += 1
        self.nodes[name] = new_entry
        for uid in self._by_node.get(name, ()):
            self._apply(self._reservations[uid], new_entry)
        self._apply_holds(new_entry)
        self.notify(name)

    def _fresh_usage(
        self,
        name: str,
        infos: tuple[DeviceInfo, ...],
        pair_scores: Mapping[str, Mapping[str, int]],
        cordoned: Iterable[str],
    ) -> NodeUsage:
        """A zero-usage NodeUsage of a node, hooked to (and marked in) the score index."""
        usage = NodeUsage.from_infos(name, infos, pair_scores, cordoned)
        usage.on_change = self._index.touch
        self._index.touch(name)
        return usage

    def rebuild_usage(self, name: str) -> None:
        """Recompute a node's usage from its devices and the reservations placed on it."""
        entry = self.nodes.get(name)
        if entry is None:
            return
        old = entry.usage
        entry.usage = self._fresh_usage(name, entry.infos, old.pair_scores, old.cordoned)
        for uid in self._by_node.get(name, ()):
            self._apply(self._reservations[uid], entry)
        self._apply_holds(entry)
        self.notify(name)

    def blank_copy(self) -> SchedulerState:
        """A quiet state with this one's config, clock and registered nodes, no usage or pods."""
        copy = SchedulerState(self.config, self.clock, self.scheduler_name)
        copy.quiet = True
        copy.placed = set(self.placed)
        for name, entry in self.nodes.items():
            usage = copy._fresh_usage(name, entry.infos, entry.usage.pair_scores, entry.usage.cordoned)
            copy.nodes[name] = NodeEntry(
                name,
                usage,
                entry.infos,
                entry.register_raw,
                entry.score_raw,
                entry.cordon_raw,
                entry.node,
                entry.handshake_at,
                entry.allocatable_gpu,
            )
        return copy

    def _allocatable(self, node: JSON) -> int:
        value = ((node.get("status") or {}).get("allocatable") or {}).get(self.config.resource_count_name, 0)
        try:
            return quantity_as_int(value, self.config.resource_count_name) or 0
        except InvalidInput:
            return 0

    def on_node_deleted(self, node: JSON) -> None:
        """Forget a deleted node's inventory (its pods' reservations stay until they go).

        Its in-process lock is dropped too unless held (a later use creates a fresh one).
        """
        name = str((node.get("metadata") or {}).get("name") or "")
        self._drop_node(name)
        self.handshake_wanted.discard(name)
        lock = self._locks.get(name)
        if lock is not None and not lock.locked():
            del self._locks[name]
        self.notify(name)

    def _drop_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self.membership += 1
        self._index.touch(name)
        for uid in self._by_node.get(name, ()):
            self._reservations[uid].applied = {}
        for holds in self._holds.values():
            for h in holds:
                if h.node == name:
                    h.applied = {}

    def _handshake(self, value: str | None) -> tuple[float | None, bool]:
        """(time of a valid ``Requesting_<t>`` stamp or None, whether to write a fresh one).

        Missing, legacy (``Reported``/``Deleted_``), malformed or unparsable values are replaced by
        ``Requesting_<now>`` (never a state that needs a hand edit to leave).
        """
        if value is None:
            return None, True
        try:
            handshake = ann.parse_handshake(value)
        except InvalidInput:
            return None, True
        if handshake.state is not ann.HandshakeState.REQUESTING or handshake.time is None:
            return None, True
        return handshake.time.timestamp(), False

    def ranked(self) -> list[tuple[float, str]]:
        """``(node score, name)`` of every registered node, ascending (do not mutate)."""
        return self._index.ranked(self.nodes)

    def schedulable(self, name: str) -> NodeEntry | None:
        """The node's entry if it is registered and healthy now, else None."""
        entry = self.nodes.get(name)
        if entry is None or not entry.healthy(self.clock()):
            return None
        return entry

    # -- reservations ---------------------------------------------------------------------------

    def reservation(self, uid: str) -> Reservation | None:
        """The reservation of pod ``uid``, if any."""
        return self._reservations.get(uid)

    def reservations(self) -> Iterator[Reservation]:
        """Every reservation (snapshot iterator)."""
        return iter(list(self._reservations.values()))

    def reserve(self, pod: JSON, node: str, layout: PodDevices, raw: str) -> Undo:
        """Tentatively book ``layout`` for ``pod`` on ``node`` (pending until its patch is seen).

        Replaces any earlier reservation of the same pod; the undo restores it.
        """
        uid = pod_uid(pod)
        meta = pod.get("metadata") or {}
        previous = self._remove(uid)
        res = Reservation(
            uid=uid,
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            node=node,
            layout=layout,
            kinds=container_kinds(pod),
            init_released=False,
            raw=raw,
            pending=True,
        )
        self.placed.add(uid)
        self._insert(res)

        def undo() -> None:
            if self._reservations.get(uid) is not res:
                return
            self._remove(uid)
            if previous is not None and uid not in self._deleted:
                self._insert(previous)

        return undo

    def confirm(self, uid: str) -> None:
        """Mark a pending reservation as persisted (its annotation patch succeeded)."""
        res = self._reservations.get(uid)
        if res is not None:
            res.pending = False
            self._touch(uid)

    def release(self, uid: str) -> Undo:
        """Release pod ``uid``'s reservation; the undo re-books it unless the pod is gone."""
        previous = self._remove(uid)
        if previous is None:
            return _noop

        def undo() -> None:
            if uid in self._reservations or uid in self._deleted:
                return
            self._insert(previous)

        return undo

    def move(self, uid: str, layout: PodDevices, raw: str) -> Undo:
        """Replace pod ``uid``'s layout on the same node (refit); the undo restores the old one.

        The undo is a no-op if the reservation was released or replaced meanwhile, so a pod
        deleted during a refit is never released twice nor resurrected.
        """
        old = self._reservations.get(uid)
        if old is None:
            raise KeyError(f"no reservation for pod {uid}")
        self._remove(uid)
        new = Reservation(
            uid=uid,
            namespace=old.namespace,
            name=old.name,
            node=old.node,
            layout=layout,
            kinds=old.kinds,
            init_released=old.init_released,
            raw=raw,
            pending=old.pending,
        )
        self._insert(new)

        def undo() -> None:
            if self._reservations.get(uid) is not new:
                return
            self._remove(uid)
            self._insert(old)

        return undo

    def changed_since(self, uid: str, seq: int) -> bool:
        """Whether pod ``uid``'s reservation changed (booked, moved, confirmed, released) after ``seq``."""
        return self._touched.get(uid, -1) > seq

    def prune_marks(self, since: int, listed: Container[str]) -> None:
        """Forget the change marks of pods a list requested at ``since`` shows gone.

        Gone: not in ``listed``, no reservation, and unchanged since ``since``.
        """
        gone = [
            uid
            for uid, seq in self._touched.items()
            if seq <= since and uid not in self._reservations and uid not in listed
        ]
        for uid in gone:
            del self._touched[uid]

    def was_deleted(self, uid: str) -> bool:
        """Whether a delete of pod ``uid`` was applied (among the last deletions remembered)."""
        return uid in self._deleted

    def adopt(self, res: Reservation | None, uid: str) -> None:
        """Make pod ``uid`` book a copy of ``res`` (another state's), or nothing when None.

        The reconcile's shadow mirrors the reservations it must not judge with this.
        """
        self._remove(uid)
        if res is not None:
            self._insert(replace(res, applied={}))

    def _touch(self, uid: str) -> None:
        self.seq += 1
        self._touched[uid] = self.seq

    def _insert(self, res: Reservation) -> None:
        self._touch(res.uid)
        self._reservations[res.uid] = res
        self._by_node.setdefault(res.node, set()).add(res.uid)
        entry = self.nodes.get(res.node)
        if entry is not None:
            self._apply(res, entry)
        else:
            res.applied = {}
        self._quota_add(res, 1)

    def _remove(self, uid: str) -> Reservation | None:
        res = self._reservations.pop(uid, None)
        if res is None:
            return None
        self._touch(uid)
        uids = self._by_node.get(res.node)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._by_node[res.node]
        entry = self.nodes.get(res.node)
        if entry is not None and res.applied:
            entry.usage.remove(res.applied)
        self._quota_add(res, -1)
        return res

    def _apply(self, res: Reservation, entry: NodeEntry) -> None:
        """Book ``res`` on ``entry`` (a fresh NodeUsage, or one without ``res``)."""
        if res.blocked is not None:
            named = res.blocked or frozenset(d.id for d in entry.usage.devices)
            res.applied = {
                d.id: DeviceAmount(max(d.count, 1), d.totalmem, d.totalcore)
                for d in entry.usage.devices
                if d.id in named
            }
        else:
            res.applied = effective_pod_usage(res.layout, res.kinds, res.init_released)
        unknown = entry.usage.add(res.applied)
        if unknown and not self.quiet:
            log.warning("allocation_on_unknown_gpu", pod=res.key, node=res.node, uuids=list(unknown))

    # -- pod events ------------------------------------------------------------------------------

    def on_pod(self, pod: JSON) -> None:
        """Apply a pod add/update (incremental, phase-aware)."""
        uid = pod_uid(pod)
        if not uid:
            return
        meta = pod.get("metadata") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        node = annotations.get(ann.VGPU_NODE)
        phase = (pod.get("status") or {}).get("phase")
        current = self._reservations.get(uid)
        version = str(meta.get("resourceVersion") or "")
        if self._holds:
            self._settle_hold(uid, version)
        if phase in _TERMINAL_PHASES:
            if current is not None:
                self._remove(uid)
                self.notify(current.node)
            return
        raw = annotations.get(ann.DEVICES_ALLOCATED)
        if current is not None and current.pending and (node != current.node or raw != current.raw):
            # The filter's patch is in flight: an event without its allocation (the pod's earlier
            # one, or none yet) predates it. Replacing the booking would free the GPUs the patch
            # is about to claim and confirm() would then confirm the old one (over-commit).
            return
        if node is None or raw is None:
            if current is not None:
                self._remove(uid)
                self.notify(current.node)
            return
        released = init_containers_succeeded(pod)
        if (
            current is not None
            and current.node == node
            and current.raw == raw
            and current.init_released == released
            and current.blocked is None
        ):
            current.version = version
            if current.pending:
                current.pending = False
                self._touch(uid)
            self.notify(node)
            return
        kinds = container_kinds(pod)
        decoded = self._allocation(pod, node, raw, current)
        if decoded is None:
            return
        layout, blocked = decoded
        self._remove(uid)
        self._insert(
            Reservation(
                uid=uid,
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""),
                node=node,
                layout=layout,
                kinds=kinds,
                init_released=released,
                raw=raw,
                blocked=blocked,
                version=version,
            )
        )
        if current is not None and current.node != node:
            self.notify(current.node)
        self.notify(node)

    def _allocation(
        self, pod: JSON, node: str, raw: str, current: Reservation | None
    ) -> tuple[PodDevices, frozenset[str] | None] | None:
        """The layout to book for ``raw`` and the GPUs to block when undecodable; None: book nothing.

        A refused allocation (:func:`booking_refusal`) releases the pod's booking; an undecodable
        one on a pod that may book blocks the GPUs it names (all of the node's when none), with a
        warning once per value.
        """
        try:
            layout: PodDevices = tuple(ann.decode_pod_devices(raw))
        except InvalidInput as exc:
            refusal = booking_refusal(self, pod, node, None)
            if refusal:
                self._refuse(pod, current, node, raw, refusal)
                return None
            entry = self.nodes.get(node)
            named = frozenset(d.id for d in entry.usage.devices if d.id in raw) if entry else frozenset()
            if not self.quiet and (current is None or current.raw != raw):
                log.warning("undecodable_allocation", pod=pod_key(pod), node=node, error=str(exc))
                self.undecodable.append((pod, str(exc)))
            return (), named
        refusal = booking_refusal(self, pod, node, layout)
        if refusal:
            self._refuse(pod, current, node, raw, refusal)
            return None
        return layout, None

    def _refuse(self, pod: JSON, current: Reservation | None, node: str, raw: str, why: str) -> None:
        """Book nothing for ``pod``'s allocation annotations (``why``); warn once per value."""
        uid = pod_uid(pod)
        if current is not None:
            self._remove(uid)
            self.notify(current.node)
        if self._refused_values.get(uid) == (node, raw):
            return
        self._refused_values[uid] = (node, raw)
        if not self.quiet:
            log.warning("allocation_refused", pod=pod_key(pod), node=node, why=why)
            self.refused.append((pod, why))

    def resync_pod(self, pod: JSON) -> None:
        """Re-derive pod's reservation from scratch through :meth:`on_pod` (the reconcile's repair)."""
        uid = pod_uid(pod)
        previous = self._remove(uid)
        self.on_pod(pod)
        if previous is not None:
            self.notify(previous.node)

    def on_pod_deleted(self, pod: JSON) -> None:
        """A pod is gone: release its reservation and remember the UID (undos skip it)."""
        uid = pod_uid(pod)
        if not uid:
            return
        self._deleted[uid] = None
        self.placed.discard(uid)
        self._refused_values.pop(uid, None)
        while len(self._deleted) > _DELETED_MEMORY:
            self._deleted.popitem(last=False)
        for h in self.holds(uid):
            self.release_hold(h)
        res = self._remove(uid)
        self._touched.pop(uid, None)
        node = (res.node if res else None) or ((pod.get("metadata") or {}).get("annotations") or {}).get(
            ann.VGPU_NODE
        )
        if node:
            self.notify(node)

    # -- quotas ------------------------------------------------------------------------------------

    def on_quota(self, quota: JSON) -> None:
        """Apply a ResourceQuota add/update (``limits.<gpumem>`` / ``limits.<gpucores>``)."""
        meta = quota.get("metadata") or {}
        hard = (quota.get("spec") or {}).get("hard") or {}
        ns = str(meta.get("namespace") or "")
        try:
            limits = quota_limits(hard, self.config)
        except InvalidInput as exc:
            log.warning("resource_quota_invalid", namespace=ns, error=str(exc))
            return
        self._quota_objects.setdefault(ns, {})[str(meta.get("name") or "")] = limits

    def on_quota_deleted(self, quota: JSON) -> None:
        """Forget a deleted ResourceQuota."""
        meta = quota.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        objects = self._quota_objects.get(ns)
        if objects is not None:
            objects.pop(str(meta.get("name") or ""), None)
            if not objects:
                del self._quota_objects[ns]

    def quota_namespaces(self) -> list[str]:
        """Namespaces with a GPU ResourceQuota (for metrics)."""
        return sorted(self._quota_objects)

    def fit_quota(self, namespace: str, exclude_uid: str = "") -> Quota | None:
        """The namespace's quota headroom for a fit (tightest limits; usage without ``exclude_uid``)."""
        objects = self._quota_objects.get(namespace)
        if not objects:
            return None
        mems = [m for m, _ in objects.values() if m is not None]
        cores = [c for _, c in objects.values() if c is not None]
        used_mem, used_cores = self.quota_used(namespace)
        res = self._reservations.get(exclude_uid) if exclude_uid else None
        if res is not None and res.namespace == namespace and res.blocked is None:
            mem, core = pod_quota_usage(res.layout, res.kinds, res.init_released)
            used_mem, used_cores = used_mem - mem, used_cores - core
        return Quota(min(mems) if mems else None, min(cores) if cores else None, used_mem, used_cores)

    def quota_used(self, namespace: str) -> tuple[int, int]:
        """(memory MiB, cores %) booked by the namespace's pods."""
        used = self._quota_used.get(namespace)
        return (used[0], used[1]) if used else (0, 0)

    # -- holds -------------------------------------------------------------------------------------

    def hold(
        self, uid: str, node: str, amounts: Mapping[str, DeviceAmount], namespace: str, mem: int, cores: int
    ) -> Hold:
        """Book ``amounts`` on ``node`` and ``mem`` MiB / ``cores`` % on ``namespace`` for pod ``uid``.

        Released by :meth:`release_hold` (once), by :meth:`on_pod_deleted`, or — after
        :meth:`settle_on_event` — by the first pod event newer than the given resourceVersion.
        A refit holds the pod's old GPUs and the larger of its old and new quota usage while its
        patch is undecided, so a filter meanwhile takes nothing a rollback would need.
        """
        h = Hold(uid, node, dict(amounts), namespace, mem, cores)
        self._holds.setdefault(uid, []).append(h)
        entry = self.nodes.get(node)
        if entry is not None:
            self._apply_hold(h, entry)
        self._quota_shift(namespace, mem, cores)
        return h

    def release_hold(self, h: Hold) -> None:
        """Give back what ``h`` books (a no-op when already released)."""
        holds = self._holds.get(h.uid)
        if holds is None or h not in holds:
            return
        holds.remove(h)
        if not holds:
            del self._holds[h.uid]
        entry = self.nodes.get(h.node)
        if entry is not None and h.applied:
            entry.usage.remove(h.applied)
        h.applied = {}
        self._quota_shift(h.namespace, -h.mem, -h.cores)
        self.notify(h.node)

    def settle_on_event(self, h: Hold, after: str) -> None:
        """Let the pod's first event newer than resourceVersion ``after`` release ``h``."""
        h.after = after

    def holds(self, uid: str) -> tuple[Hold, ...]:
        """The holds booked for pod ``uid``."""
        return tuple(self._holds.get(uid, ()))

    def _settle_hold(self, uid: str, version: str) -> None:
        """A pod event at ``version``: release the holds it decides (see :meth:`settle_on_event`)."""
        for h in list(self._holds.get(uid, ())):
            if h.after is not None and newer_than(version, h.after):
                self.release_hold(h)

    def settle_holds(self, list_version: str) -> list[str]:
        """Release the event-settled holds a list at ``list_version`` decides; their pod UIDs."""
        decided: list[str] = []
        for uid, holds in list(self._holds.items()):
            for h in list(holds):
                if h.after is not None and newer_than(list_version, h.after):
                    self.release_hold(h)
                    decided.append(uid)
        return decided

    def _apply_holds(self, entry: NodeEntry) -> None:
        for holds in self._holds.values():
            for h in holds:
                if h.node == entry.name:
                    self._apply_hold(h, entry)

    def _apply_hold(self, h: Hold, entry: NodeEntry) -> None:
        h.applied = dict(h.amounts)
        entry.usage.add(h.applied)

    def _quota_add(self, res: Reservation, sign: int) -> None:
        if res.blocked is not None:
            return
        mem, cores = pod_quota_usage(res.layout, res.kinds, res.init_released)
        self._quota_shift(res.namespace, sign * mem, sign * cores)

    def _quota_shift(self, namespace: str, mem: int, cores: int) -> None:
        used = self._quota_used.setdefault(namespace, [0, 0])
        used[0] += mem
        used[1] += cores
        if used == [0, 0]:
            del self._quota_used[namespace]

    # -- views -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> GPU UUID -> (used slots, used MiB, used cores): for equality checks and metrics."""
        return {
            name: {d.id: (d.used, d.usedmem, d.usedcores) for d in entry.usage.devices}
            for name, entry in sorted(self.nodes.items())
        }

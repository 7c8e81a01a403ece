"""The scheduler's accounting ledger: what each pod books (by pod UID), per-GPU usage, quota usage.

Owned by the event loop: every mutation is synchronous (between awaits). Operations that must
await the API (filter patch, bind, refit) make a tentative change first and keep the returned
:data:`Undo` to roll it back on failure.

Accounting is incremental: pod add/update/delete events adjust the per-device usage of one node
of the :class:`~hamid.scheduler.inventory.NodeInventory`; a rebuild from a fresh list in any order
gives the same usage (see :meth:`Ledger.snapshot`). The periodic reconcile
(:mod:`hamid.scheduler.reconcile`) feeds such a list into a *shadow* — a quiet :class:`Ledger`
over a blank copy of the inventory (:meth:`Ledger.blank_copy`), with this same surface — and
repairs the live ledger where the two differ.

The ledger trusts what it booked, not what a pod says later (docs/trust.md): a booked pod's
booking changes only through the scheduler's own verbs (:meth:`Ledger.reserve`,
:meth:`Ledger.move`, :meth:`Ledger.release`; a finished or deleted pod releases), or by an
allocation this scheduler signed after the one booked (another replica's refit) where it fits
beside the other bookings (:meth:`Ledger._room_refusal`). An annotation
that disagrees with the booking is reported (``disagreed``: a Warning Event, a metric, a log line)
and never re-booked. A pod without a booking (a restart, another replica's filter) books its
allocation only when its signature verifies (:mod:`hamid.scheduler.signing`); unsigned or
mis-signed is foreign and books nothing, and an unreadable allocation books nothing at all. The
signed allocation recorded in the pod's status by a bind or a refit stands over annotations that
do not verify, or verify as older (a tenant rewrote them past admission).

A pod's MIG reservations (``hami.io/vgpu-mig-allocations``, less the runtime ids its plugin adds)
are part of its allocation here: signed and recorded with it, compared with the booking as it is,
booked on the GPUs they name (their placements occupied; memory, cores and slots the sum of the
pod's entries there, init containers' included, as its instances all live until it ends) and
released with it. A booking that is
inconsistent on MIG (:func:`~hamid.fit.mig.mig_faults`) makes that GPU unfit while it stays, and
is logged (``mig_reservation_inconsistent``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field, replace

from hamid.fit.fit import Quota, pod_quota_usage
from hamid.fit.mig import mig_refusal
from hamid.fit.usage import (
    ContainerKind,
    DeviceAmount,
    allocation_refusal,
    container_kinds,
    effective_pod_usage,
    init_containers_succeeded,
    overcommit_refusal,
    with_mig,
)
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.booked import booked_record
from hamid.model.devices import PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.mig import MigAllocation, decode_mig_allocations, reservation_text
from hamid.model.objects import newer_than
from hamid.model.resources import ResourceConfig, pod_requests
from hamid.scheduler.coordination import Coordination
from hamid.scheduler.inventory import NodeEntry, NodeInventory
from hamid.scheduler.quotas import QuotaBook
from hamid.scheduler.signing import AllocationKeys
from hamid.scheduler.webhook import DEFAULT_SCHEDULER

log = get_logger("scheduler.state")

#: Rolls back one tentative change; calling it twice, or after the pod is gone, is a no-op.
Undo = Callable[[], None]

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_DELETED_MEMORY = 10_000
#: How long an undecided refit's hold waits for its pod to change before a reconcile that lists
#: the pod unchanged settles it as not applied: well past the API server's request timeout
#: (kube-apiserver ``--request-timeout``, 60 s by default), by which a write whose client gave up
#: has been applied or dropped; without a bound, the hold of a pod that never changes would
#: book its GPUs twice until the pod ends.
UNDECIDED_HOLD_S = 300.0


def _noop() -> None:
    """An undo with nothing to roll back."""


@dataclass(slots=True)
class Reservation:
    """What one pod books: its node, positional allocation and the usage applied to that node.

    ``pending`` is True while the filter's annotation patch is in flight. ``version`` is the pod
    resourceVersion it was last derived from ("" for the filter's own). ``issued`` is when the
    booked allocation was signed (ms since the epoch; 0 when unsigned). ``mig`` holds its MIG
    reservations (their GPU, profile and placement).
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
    applied: dict[str, DeviceAmount] = field(default_factory=dict)
    version: str = ""
    issued: int = 0
    mig: tuple[MigAllocation, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def mig_text(self) -> str:
        """The MIG reservations as signed and recorded (``""``: none)."""
        return reservation_text(self.mig)


@dataclass(slots=True, eq=False)
class Hold:
    """Usage booked for pod ``uid`` beyond its reservation while a write about it is undecided.

    A refit books the pod's old GPUs (``amounts`` on ``node``, of allocation ``kept``, booked
    when the hold was made) and the larger of its old and new quota usage (``mem``/``cores`` more
    on ``namespace``) until its patch is decided. ``after`` is None while the refit decides
    itself; once set (at ``unknown_since``), the first pod event newer than that resourceVersion
    decides instead, or the pod's delete, or a reconcile (:meth:`Ledger.settle_holds`); an event
    that names the refit's ``target`` allocation, booked, tells ``on_landed``.
    """

    uid: str
    node: str
    amounts: dict[str, DeviceAmount]
    namespace: str
    mem: int
    cores: int
    kept: str = ""
    after: str | None = None
    unknown_since: float = 0.0  #: on :attr:`Ledger.elapsed`'s clock
    #: Past :data:`UNDECIDED_HOLD_S` with its pod unchanged: the pod's next feed decides (not applied).
    expired: bool = False
    applied: dict[str, DeviceAmount] = field(default_factory=dict)
    #: The allocation the undecided write names, and what to call when a pod event deciding the
    #: hold shows it landed (the event names it and it stays booked): the refit's status record.
    target: str = ""
    on_landed: Callable[[], None] | None = None


def _quota_usage(res: Reservation) -> tuple[int, int]:
    """(memory, cores) reservation ``res`` counts against its namespace's quota."""
    return pod_quota_usage(res.layout, res.kinds, res.init_released, res.mig)


def _mig_text(value: str | None) -> str:
    """The MIG reservations an annotation names, as signed (runtime ids left out); a value that does
    not decode stays as it is (it then verifies as nothing, and its booking reports it)."""
    if not value:
        return ""
    try:
        return reservation_text(decode_mig_allocations(value))
    except InvalidInput:
        return value


def booking_refusal(ledger: Ledger, pod: PodBody, node: str, layout: PodDevices) -> str:
    """Why pod's allocation annotations must not be booked on ``node`` ("" to book them).

    Even a trusted allocation is booked only for a pod that requests the GPUs, runs (if bound)
    on the node it names, is this scheduler's (or the default scheduler's, whose pods the webhook
    hands to this one) or was placed by it, and whose allocation ``layout`` its requests and the
    node's register confirm (:func:`~hamid.fit.usage.allocation_refusal`).
    """
    spec = objects.section(pod, "spec")
    bound = spec.get("nodeName")
    if bound and bound != node:
        return f"the pod runs on node {bound}, its {ann.VGPU_NODE} names {node}"
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    ours = ledger.scheduler_name
    if ours and scheduler not in (ours, DEFAULT_SCHEDULER) and objects.uid(pod) not in ledger.placed:
        return f"the pod is scheduled by {scheduler!r}, which is not {ours!r}"
    try:
        requests = pod_requests(pod, ledger.config)
    except InvalidInput as exc:
        return f"its requests cannot be read: {exc}"
    entry = ledger.inventory.nodes.get(node)
    return allocation_refusal(layout, requests, entry.usage.by_id if entry is not None else None)


class Ledger:
    """Reservations, holds and quota usage of one scheduler process over its inventory."""

    def __init__(
        self,
        config: ResourceConfig | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_name: str = "",
        *,
        inventory: NodeInventory | None = None,
        coordination: Coordination | None = None,
        quiet: bool = False,
        keys: AllocationKeys | None = None,
        accept_unsigned: bool = False,
    ) -> None:
        self.config = config or ResourceConfig()
        self.clock = clock
        #: How long an undecided refit's hold has waited (:data:`UNDECIDED_HOLD_S`): monotonic, so a
        #: step of the wall clock (NTP, a VM resumed) neither ends a hold early nor keeps it.
        self.elapsed: Callable[[], float] = time.monotonic
        #: The scheduler's name: a pod of another scheduler is booked only if this one placed it.
        self.scheduler_name = scheduler_name
        self.inventory = inventory or NodeInventory(self.config, clock)
        self.coordination = coordination or Coordination()
        self.quotas = QuotaBook(self.config)
        #: A throwaway copy (the reconcile's shadow): no warnings about what it is fed.
        self.quiet = quiet
        #: The signing key ring; None: allocations are neither signed nor verified (unsigned mode).
        self.keys = keys
        #: With a key ring: book an allocation without any signature too (an upgrade's one rollout).
        self.accept_unsigned = accept_unsigned
        #: UIDs of the pods this process reserved (its own record; forgotten on delete).
        self.placed: set[str] = set()
        self._reservations: dict[str, Reservation] = {}
        self._by_node: dict[str, set[str]] = {}
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._holds: dict[str, list[Hold]] = {}
        self._reported: dict[str, tuple[str | None, str | None]] = {}
        #: Bumped by every reservation change; :meth:`changed_since` compares against it.
        self.seq = 0
        self._touched: dict[str, int] = {}

    def blank_copy(self) -> Ledger:
        """A quiet ledger with this one's config, clock, registered nodes, quota limits and holds
        (never settled there), no pods: it judges room as this one does."""
        copy = Ledger(
            self.config,
            self.clock,
            self.scheduler_name,
            inventory=self.inventory.blank_copy(),
            quiet=True,
            keys=self.keys,
            accept_unsigned=self.accept_unsigned,
        )
        copy.placed = set(self.placed)
        copy.quotas = self.quotas.blank_copy()
        for holds in self._holds.values():
            for h in holds:
                copy.hold(h.uid, h.node, h.amounts, h.namespace, h.mem, h.cores)
        return copy

    # -- views --------------------------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, NodeEntry]:
        """The registered nodes (the inventory's; read-only for callers)."""
        return self.inventory.nodes

    @property
    def membership(self) -> int:
        """Bumped whenever a node name joins or leaves :attr:`nodes`."""
        return self.inventory.membership

    @property
    def handshake_wanted(self) -> set[str]:
        """Nodes whose handshake annotation the leader must (re)write."""
        return self.inventory.handshake_wanted

    @property
    def undecodable(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods with an undecodable allocation and the error (Warning Events)."""
        return self.coordination.undecodable

    @property
    def refused(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods whose allocation annotations were not booked, with why (Warning Events)."""
        return self.coordination.refused

    @property
    def foreign(self) -> list[tuple[PodBody, str]]:
        """Outbox: pods whose allocation is unsigned or mis-signed (not booked), with why."""
        return self.coordination.foreign

    @property
    def disagreed(self) -> list[tuple[PodBody, str]]:
        """Outbox: booked pods whose annotations now disagree with the booking, with why."""
        return self.coordination.disagreed

    def ranked(self) -> list[tuple[float, str]]:
        """``(node score, name)`` of every registered node, ascending (do not mutate)."""
        return self.inventory.ranked()

    def schedulable(self, name: str) -> NodeEntry | None:
        """The node's entry if it is registered and healthy now, else None."""
        return self.inventory.schedulable(name)

    def quota_namespaces(self) -> list[str]:
        """Namespaces with a GPU ResourceQuota or GPU usage booked (for metrics)."""
        return self.quotas.namespaces()

    def quota_usage(self, namespace: str) -> tuple[tuple[int | None, int | None], tuple[int, int]]:
        """((memory MiB, cores %) limits, None where unset; (memory, cores) booked) of a namespace."""
        return self.quotas.limits(namespace) or (None, None), self.quotas.used(namespace)

    # -- coordination ---------------------------------------------------------------------------

    def node_guard(self, node: str) -> asyncio.Lock:
        """The guard of ``node``, an in-process lock (hold it across an await that must keep the plan)."""
        return self.coordination.node_guard(node)

    def node_busy(self, node: str) -> bool:
        """Whether a refit or node-lock acquisition holds the node's lock, or a hold is booked on it."""
        return self.coordination.locked(node) or self.held_on(node)

    def notify(self, node: str) -> None:
        """Wake every :meth:`wait_change` waiter of ``node``."""
        self.coordination.notify(node)

    async def wait_change(self, node: str, max_wait: float) -> bool:
        """Wait until the node (or a pod placed on it) changes; False when ``max_wait`` s passed."""
        return await self.coordination.wait_change(node, max_wait)

    # -- reservations ---------------------------------------------------------------------------

    def reservation(self, uid: str) -> Reservation | None:
        """The reservation of pod ``uid``, if any."""
        return self._reservations.get(uid)

    def reservations(self) -> Iterator[Reservation]:
        """Every reservation (snapshot iterator)."""
        return iter(list(self._reservations.values()))

    def signature(self, uid: str, node: str, raw: str, mig: str = "") -> dict[str, str | None]:
        """The signature annotation to write beside allocation ``raw`` and MIG reservations ``mig``
        (removed in unsigned mode)."""
        value = self.keys.sign(uid, node, raw, mig) if self.keys is not None else None
        return {ann.ALLOCATION_SIGNATURE: value}

    def _issued(self, uid: str, node: str, raw: str, signature: str | None, mig: str = "") -> int:
        signed = self.keys.verify(uid, node, raw, signature, mig) if self.keys is not None else None
        return signed.issued if signed is not None else 0

    def reserve(
        self,
        pod: PodBody,
        node: str,
        layout: PodDevices,
        raw: str,
        signature: str | None = None,
        mig: tuple[MigAllocation, ...] = (),
    ) -> Undo:
        """Tentatively book ``layout`` and MIG reservations ``mig`` for ``pod`` on ``node`` (pending
        until its patch is seen).

        ``signature`` is the one written with it (:meth:`signature`). Replaces any earlier
        reservation of the same pod; the undo restores it.
        """
        uid = objects.uid(pod)
        previous = self._remove(uid)
        res = Reservation(
            uid=uid,
            namespace=objects.namespace(pod),
            name=objects.name(pod),
            node=node,
            layout=layout,
            kinds=container_kinds(pod),
            init_released=False,
            raw=raw,
            pending=True,
            issued=self._issued(uid, node, raw, signature, reservation_text(mig)),
            mig=mig,
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

    def confirm(self, uid: str, node: str, raw: str) -> None:
        """Mark the pending reservation a patch wrote as persisted (its annotation patch succeeded):
        only that one (a second filter of the same pod may have booked another meanwhile)."""
        res = self._reservations.get(uid)
        if res is not None and res.node == node and res.raw == raw:
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

    def move(self, uid: str, layout: PodDevices, raw: str, signature: str | None = None) -> Undo:
        """Replace pod ``uid``'s layout on the same node (refit); the undo restores the old one.

        The undo is a no-op if the reservation was released or replaced meanwhile, so a pod
        deleted during a refit is never released twice nor resurrected.
        """
        old = self._reservations.get(uid)
        if old is None:
            raise KeyError(f"no reservation for pod {uid}")
        self._remove(uid)
        issued = self._issued(uid, old.node, raw, signature)
        new = replace(old, layout=layout, raw=raw, applied={}, version="", issued=issued)
        self._insert(new)

        def undo() -> None:
            if self._reservations.get(uid) is not new:
                return
            self._remove(uid)
            self._insert(replace(old, init_released=new.init_released))  # status seen meanwhile

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
        """Make pod ``uid`` book a copy of ``res`` (another ledger's), or nothing when None.

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
        entry = self.inventory.nodes.get(res.node)
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
        entry = self.inventory.nodes.get(res.node)
        if entry is not None and res.applied:
            entry.usage.remove(res.applied)
        self._quota_add(res, -1)
        return res

    def _apply(self, res: Reservation, entry: NodeEntry) -> None:
        """Book ``res`` on ``entry`` (a fresh NodeUsage, or one without ``res``)."""
        usage = entry.usage
        res.applied = effective_pod_usage(res.layout, res.kinds, res.init_released, res.mig)
        if res.mig or usage.has_mig:
            res.applied = with_mig(res.applied, res.layout, res.mig, usage.by_id)
            problems = usage.mig_problems(res.applied)
            if problems and not self.quiet:
                log.warning("mig_reservation_inconsistent", pod=res.key, node=res.node, problems=problems)
        unknown = usage.add(res.applied)
        if unknown and not self.quiet:
            log.warning("allocation_on_unknown_gpu", pod=res.key, node=res.node, uuids=list(unknown))

    # -- nodes -------------------------------------------------------------------------------------

    def book_node(self, name: str) -> None:
        """Book every reservation and hold placed on node ``name`` onto its (zero-usage) GPUs."""
        entry = self.inventory.nodes.get(name)
        if entry is None:
            return
        for uid in self._by_node.get(name, ()):
            self._apply(self._reservations[uid], entry)
        for holds in self._holds.values():
            for h in holds:
                if h.node == name:
                    self._apply_hold(h, entry)

    def unbook_node(self, name: str) -> None:
        """Node ``name`` left the inventory: nothing stays applied on its GPUs."""
        for uid in self._by_node.get(name, ()):
            self._reservations[uid].applied = {}
        for holds in self._holds.values():
            for h in holds:
                if h.node == name:
                    h.applied = {}

    def rebuild_usage(self, name: str) -> None:
        """Recompute a node's usage from its devices and the reservations placed on it."""
        if self.inventory.reset_usage(name) is None:
            return
        self.book_node(name)
        self.coordination.notify(name)

    def snapshot(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> GPU UUID -> (used slots, used MiB, used cores): for equality checks and metrics."""
        return {
            name: {d.id: (d.used, d.usedmem, d.usedcores) for d in entry.usage.devices}
            for name, entry in sorted(self.inventory.nodes.items())
        }

    # -- pod events ------------------------------------------------------------------------------

    def on_pod(self, pod: PodBody) -> None:
        """Apply a pod add/update (incremental, phase-aware; what it trusts: the module doc)."""
        uid = objects.uid(pod)
        if not uid:
            return
        decided = self._settle_hold(uid, objects.resource_version(pod)) if self._holds else ()
        self._apply_pod(pod, uid, frozenset((h.node, h.kept) for h in decided))
        for h in decided:
            if h.on_landed is not None and self._landed(pod, h):
                h.on_landed()

    def _landed(self, pod: PodBody, h: Hold) -> bool:
        """Whether pod event ``pod``, which decided ``h``, shows its write landed: the pod names the
        write's allocation and it is what the pod books now (a later write of the same allocation,
        not yet landed, has moved the booking there but is not on the pod)."""
        named = objects.annotations(pod)
        res = self._reservations.get(h.uid)
        return (
            res is not None
            and (named.get(ann.VGPU_NODE), named.get(ann.DEVICES_ALLOCATED)) == (h.node, h.target)
            and (res.node, res.raw) == (h.node, h.target)
        )

    def _apply_pod(self, pod: PodBody, uid: str, kept: frozenset[tuple[str, str]]) -> None:
        """:meth:`on_pod` once the holds the event decides are released (``kept``: what each kept)."""
        current = self._reservations.get(uid)
        if objects.section(pod, "status").get("phase") in _TERMINAL_PHASES:
            self._forget(uid, current)
            return
        node, raw, signature, mig = self._allocation(pod)
        named = (node, raw, mig)
        if current is not None and current.pending and named != (current.node, current.raw, current.mig_text):
            # The filter's patch is in flight: an event without its allocation (the pod's earlier
            # one, or none yet) predates it. Replacing the booking would free the GPUs the patch
            # is about to claim and confirm() would then confirm the old one (over-commit).
            return
        if current is not None:
            self._follow_init(current, init_containers_succeeded(pod))
        if current is not None and named == (current.node, current.raw, current.mig_text):
            self._keep(pod, current)
            return
        if node is None or raw is None:
            if current is not None:
                self._disagree(pod, current, node, raw, "the allocation annotations were removed")
            return
        rollback = (node, raw) in kept
        issued = self._claim(pod, node, raw, signature, mig, current, rollback)
        if issued is not None:
            self._book(pod, node, raw, mig, issued, current, rollback)

    def _allocation(self, pod: PodBody) -> tuple[str | None, str | None, str | None, str]:
        """(node, allocation, signature, MIG reservations) the pod names: its annotations', or the
        record in its status (:func:`~hamid.model.booked.booked_record`) where that verifies and the
        annotations' signature does not, or is older. Annotations that then differ from the record
        are reported: a tenant rewrote them past admission, the record it cannot write stands."""
        annotations = objects.annotations(pod)
        node, raw = annotations.get(ann.VGPU_NODE), annotations.get(ann.DEVICES_ALLOCATED)
        signature = annotations.get(ann.ALLOCATION_SIGNATURE)
        mig = _mig_text(annotations.get(ann.MIG_ALLOCATIONS))
        keys, record = self.keys, booked_record(pod)
        if keys is None or record is None:
            return node, raw, signature, mig
        uid = objects.uid(pod)
        proven = keys.verify(uid, record.node, record.allocated, record.signature, record.mig)
        if proven is None:
            return node, raw, signature, mig
        claimed = (
            keys.verify(uid, node, raw, signature, mig) if node is not None and raw is not None else None
        )
        if claimed is not None and claimed.issued >= proven.issued:
            return node, raw, signature, mig
        if (node, raw, mig) != (record.node, record.allocated, record.mig):
            booked = f"{record.allocated} {record.mig}" if record.mig else record.allocated
            why = (
                f"they differ from the allocation this scheduler recorded as booked in the pod's "
                f"status ({ann.ALLOCATION_BOOKED_CONDITION}, not writable by tenants); "
                f"{record.node}: {booked} is what it books"
            )
            self._report(self.coordination.disagreed, "disagreement", pod, node, raw, why)
        return record.node, record.allocated, record.signature, record.mig

    def _follow_init(self, current: Reservation, released: bool) -> None:
        """Follow the pod's init release (kubelet's status, not the pod's annotations), in place:
        the same reservation object stays booked, so an undo keyed on it still applies."""
        if current.init_released == released:
            return
        self._remove(current.uid)
        current.init_released = released
        self._insert(current)
        self.coordination.notify(current.node)

    def _keep(self, pod: PodBody, current: Reservation) -> None:
        """The pod still names its booked allocation: confirm it and follow its version."""
        if current.pending:
            current.pending = False
            self._touch(current.uid)
        current.version = objects.resource_version(pod)
        self.coordination.notify(current.node)

    def _claim(
        self,
        pod: PodBody,
        node: str,
        raw: str,
        signature: str | None,
        mig: str,
        current: Reservation | None,
        rollback: bool,
    ) -> int | None:
        """When the allocation ``raw`` the pod names now was signed (0: unsigned) if it may be
        booked; None (reported) when it is foreign or disagrees with the booking.

        With a key ring, only a verified signature books a pod without a booking (or, with
        ``accept_unsigned``, no signature at all), and only one signed after the booked allocation
        replaces a booking (another replica's refit, where it fits: :meth:`_book`), or the
        ``rollback`` of this replica's undecided refit the pod's event decided. Without one, a
        booking is replaced from a pod only by such a rollback.
        """
        uid = objects.uid(pod)
        signed = self.keys.verify(uid, node, raw, signature, mig) if self.keys is not None else None
        if self.keys is None:
            if current is None or rollback:
                return 0
            why = "a booking changes only through the scheduler's own filter, bind, refit or release"
        elif signed is not None:
            if current is None or rollback or signed.issued > current.issued:
                return signed.issued
            why = "it is signed no later than the booked allocation (a replayed allocation)"
        elif signature is None:
            if current is None and self.accept_unsigned:
                return 0
            why = (
                f"it has no {ann.ALLOCATION_SIGNATURE}: this scheduler did not write it (a pod placed "
                "by HAMi's scheduler before hamid is booked only with --allow-unsigned-allocations)"
            )
        else:
            why = f"its {ann.ALLOCATION_SIGNATURE} does not verify: this scheduler did not write it"
        if current is None:
            self._report(self.coordination.foreign, "foreign", pod, node, raw, why)
        else:
            self._disagree(pod, current, node, raw, why)
        return None

    def _disagree(
        self, pod: PodBody, current: Reservation, node: str | None, raw: str | None, why: str
    ) -> None:
        """Report annotations that disagree with ``current``, which stays booked as it is."""
        detail = f"{why}; {current.node}: {current.raw} stays booked"
        self._report(self.coordination.disagreed, "disagreement", pod, node, raw, detail)

    def _forget(self, uid: str, current: Reservation | None) -> None:
        """The pod books nothing any more (it finished)."""
        if current is not None:
            self._remove(uid)
            self.coordination.notify(current.node)

    def _book(
        self,
        pod: PodBody,
        node: str,
        raw: str,
        mig_text: str,
        issued: int,
        current: Reservation | None,
        rollback: bool,
    ) -> None:
        """Book the allocation ``raw`` and MIG reservations ``mig_text`` the pod names on ``node``
        (if it may book; a refused replacement leaves ``current`` booked).

        ``rollback``: the pod names the old allocation of this replica's refit, whose GPUs its hold
        kept until this event decided the refit was not applied, so no room is judged.
        """
        try:
            layout: PodDevices = tuple(ann.decode_pod_devices(raw))
            mig = decode_mig_allocations(mig_text)
        except InvalidInput as exc:
            self._report(self.coordination.undecodable, "undecodable", pod, node, raw, str(exc))
            return
        uid = objects.uid(pod)
        refusal = booking_refusal(self, pod, node, layout) or mig_refusal(layout, mig)
        if not refusal and not rollback:
            self._remove(uid)  # judged beside the other bookings, not beside its own
            refusal = self._room_refusal(pod, node, layout, mig, current)
            if refusal and current is not None:
                self._insert(current)
                refusal = f"{refusal}; {current.node}: {current.raw} stays booked"
        if refusal:
            self._report(self.coordination.refused, "booking", pod, node, raw, refusal)
            return
        self._remove(uid)
        self._insert(
            Reservation(
                uid=uid,
                namespace=objects.namespace(pod),
                name=objects.name(pod),
                node=node,
                layout=layout,
                kinds=container_kinds(pod),
                init_released=init_containers_succeeded(pod),
                raw=raw,
                version=objects.resource_version(pod),
                issued=issued,
                mig=mig,
            )
        )
        if current is not None and current.node != node:
            self.coordination.notify(current.node)
        self.coordination.notify(node)

    def _room_refusal(
        self,
        pod: PodBody,
        node: str,
        layout: PodDevices,
        mig: tuple[MigAllocation, ...],
        replaces: Reservation | None,
    ) -> str:
        """Why booking ``layout`` beside the other bookings would over-commit a GPU (its MIG
        placements too) or the namespace's GPU quota ("" when it fits).

        Judged for an allocation that replaces a booking (a later-signed refit) and for a first
        booking of a pod not yet bound (a filter's this replica did not make). Either may be a
        write the API server applied late: after its replica undid or lost its hold, or after a
        takeover, when the new leader had placed other pods there (HA audits: a filter write was
        bound past a GPU's capacity and past the quota; a refit was booked at 60,000 of 40,000
        MiB). Refused, a replacement keeps the earlier booking (where the container may still
        run) and a first booking books nothing, so its bind fails and kube-scheduler filters the
        pod again. A bound pod's first booking is booked as it runs. Judged as the booking would
        be: init containers only while they run; against the quota, only what the namespace's
        usage grows by replacing the booking ``replaces`` (its own, taken off meanwhile).
        """
        if replaces is None and objects.section(pod, "spec").get("nodeName"):
            return ""
        kinds = container_kinds(pod)
        released = init_containers_succeeded(pod)
        namespace = objects.namespace(pod)
        quota = self.fit_quota(namespace)
        mem, cores = pod_quota_usage(layout, kinds, released, mig)
        booked = (0, 0) if replaces is None else _quota_usage(replaces)
        if quota is not None and not quota.keeping(*booked).fits(mem, cores):
            return (
                f"namespace {namespace} books {quota.used_mem} MiB, {quota.used_cores} % of its GPU "
                f"quota (limits {quota.mem_limit} MiB, {quota.cores_limit} %): {mem} MiB, "
                f"{cores} % more do not fit"
            )
        entry = self.inventory.nodes.get(node)
        if entry is None:
            return ""
        refusal = overcommit_refusal(layout, kinds, entry.usage.by_id, mig, released)
        if refusal or not mig:
            return refusal
        usage = with_mig(effective_pod_usage(layout, kinds, released, mig), layout, mig, entry.usage.by_id)
        return "; ".join(entry.usage.mig_problems(usage))

    def _report(
        self,
        outbox: list[tuple[PodBody, str]],
        outcome: str,
        pod: PodBody,
        node: str | None,
        raw: str | None,
        why: str,
    ) -> None:
        """Log and queue a Warning Event about ``pod``'s annotations not taken, once per value.

        ``outcome`` (``booking``, ``foreign``, ``undecodable``, ``disagreement``) is also the
        ``where`` of ``hamid_untrusted_annotations_total`` the Event counts.
        """
        uid = objects.uid(pod)
        if self._reported.get(uid) == (node, raw):
            return
        self._reported[uid] = (node, raw)
        if not self.quiet:
            log.warning(
                "allocation_annotations_not_taken",
                outcome=outcome,
                pod=objects.namespaced_key(pod),
                node=node,
                why=why,
            )
            outbox.append((pod, why))

    def on_pod_deleted(self, pod: PodBody) -> None:
        """A pod is gone: release its reservation and remember the UID (undos skip it)."""
        uid = objects.uid(pod)
        if not uid:
            return
        self._deleted[uid] = None
        self.placed.discard(uid)
        self._reported.pop(uid, None)
        while len(self._deleted) > _DELETED_MEMORY:
            self._deleted.popitem(last=False)
        for h in self.holds(uid):
            self.release_hold(h)
        res = self._remove(uid)
        self._touched.pop(uid, None)
        node = (res.node if res else None) or objects.annotations(pod).get(ann.VGPU_NODE)
        if node:
            self.coordination.notify(node)

    # -- quotas ------------------------------------------------------------------------------------

    def fit_quota(self, namespace: str, exclude_uid: str = "") -> Quota | None:
        """The namespace's quota headroom for a fit (tightest limits; usage without ``exclude_uid``)."""
        limits = self.quotas.limits(namespace)
        if limits is None:
            return None
        used_mem, used_cores = self.quotas.used(namespace)
        res = self._reservations.get(exclude_uid) if exclude_uid else None
        if res is not None and res.namespace == namespace:
            mem, core = _quota_usage(res)
            used_mem, used_cores = used_mem - mem, used_cores - core
        return Quota(limits[0], limits[1], used_mem, used_cores)

    def _quota_add(self, res: Reservation, sign: int) -> None:
        mem, cores = _quota_usage(res)
        self.quotas.shift(res.namespace, sign * mem, sign * cores)

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
        res = self._reservations.get(uid)
        kept = res.raw if res is not None and res.node == node else ""
        h = Hold(uid, node, dict(amounts), namespace, mem, cores, kept)
        self._holds.setdefault(uid, []).append(h)
        entry = self.inventory.nodes.get(node)
        if entry is not None:
            self._apply_hold(h, entry)
        self.quotas.shift(namespace, mem, cores)
        return h

    def release_hold(self, h: Hold) -> None:
        """Give back what ``h`` books (a no-op when already released)."""
        holds = self._holds.get(h.uid)
        if holds is None or h not in holds:
            return
        holds.remove(h)
        if not holds:
            del self._holds[h.uid]
        entry = self.inventory.nodes.get(h.node)
        if entry is not None and h.applied:
            entry.usage.remove(h.applied)
        h.applied = {}
        self.quotas.shift(h.namespace, -h.mem, -h.cores)
        self.coordination.notify(h.node)

    def settle_on_event(
        self, h: Hold, after: str, target: str = "", on_landed: Callable[[], None] | None = None
    ) -> None:
        """Let the pod's first event newer than resourceVersion ``after`` release ``h``; if that event
        names allocation ``target`` and it stays booked, call ``on_landed``."""
        h.after = after
        h.unknown_since = self.elapsed()
        h.target, h.on_landed = target, on_landed

    def holds(self, uid: str) -> tuple[Hold, ...]:
        """The holds booked for pod ``uid``."""
        return tuple(self._holds.get(uid, ()))

    def held_on(self, node: str) -> bool:
        """Whether a hold is booked on ``node``."""
        return any(h.node == node for holds in self._holds.values() for h in holds)

    def _settle_hold(self, uid: str, version: str) -> tuple[Hold, ...]:
        """A pod event at ``version``: release the holds it decides (see :meth:`settle_on_event`) and
        return them; the (node, allocation) each kept the event may name as the refit's rollback."""
        decided = tuple(
            h
            for h in self._holds.get(uid, ())
            if h.after is not None and (h.expired or newer_than(version, h.after))
        )
        for h in decided:
            self.release_hold(h)
        return decided

    def settle_holds(self, list_version: str, listed: Mapping[str, PodBody]) -> list[str]:
        """The listed pods (UIDs) whose event-settled holds a list at ``list_version`` decides: fed
        to :meth:`on_pod`, each is then decided as its event would be (the pod changed since the
        hold's precondition; or, listed unchanged past :data:`UNDECIDED_HOLD_S`, not applied: the
        write may land until then), its room judged as any allocation's but the rollback's. The
        hold of a pod not listed in a list newer than the precondition (gone) is released here."""
        decided: list[str] = []
        now = self.elapsed()
        for uid, holds in list(self._holds.items()):
            pod = listed.get(uid)
            for h in list(holds):
                if h.after is None:
                    continue
                if pod is None:
                    if newer_than(list_version, h.after):
                        self.release_hold(h)
                    continue
                if not newer_than(objects.resource_version(pod), h.after):
                    waited = now - h.unknown_since
                    if waited < UNDECIDED_HOLD_S:
                        continue
                    h.expired = True
                    log.warning(
                        "refit_hold_expired",
                        pod=objects.namespaced_key(pod),
                        node=h.node,
                        held=sorted(h.amounts),
                        waited_s=round(waited, 1),
                    )
                decided.append(uid)
        return list(dict.fromkeys(decided))

    def _apply_hold(self, h: Hold, entry: NodeEntry) -> None:
        h.applied = dict(h.amounts)
        entry.usage.add(h.applied)

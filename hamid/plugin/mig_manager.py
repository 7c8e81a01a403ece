"""The dynamic MIG instance manager: the one owner of this node's GPU and compute instances.

The scheduler reserves a GPU, a profile and a placement per MIG device (``hami.io/vgpu-mig-
allocations``); ``Allocate`` asks :meth:`MigManager.ensure` to realize each reservation, exactly
there and never elsewhere. A reservation key (GPU, profile, placement) maps to at most one managed
instance, handed to one pod (its owner), so a repeated ``Allocate`` of that pod converges on the
instance already made and no other pod is handed it while its owner is active. The pods stay the
record (a pod's reservations are those its status record books; the annotation only where it agrees
with the record, or where there is none: :func:`pod_reservations`): an instance whose owner holds
its reservation no more (the pod finished or is gone) is destroyed by :meth:`MigManager.reconcile`,
periodically and before a creation that would overlap it, and only from a complete, fresh pod list
(a failed read destroys nothing; an unreadable pod keeps the instances of its GPUs).

At start (:meth:`MigManager.start`, before kubelet can call ``Allocate``): GPUs no active pod
reserves and with no process on a MIG device are reset (every leftover instance destroyed); on the
others realized records of active pods are verified against NVML and adopted, so a restarted plugin
re-creates nothing, and every other instance is registered without an owner, for a reconcile to
destroy once idle and no running pod's reservation overlaps it. Until the pod list can be read,
nothing is touched (the start waits for it).

Per GPU, NVML mutations are serialised (one :class:`asyncio.Lock` each) and run in a thread, as
all of hamid's NVML use does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.annotations import MIG_ALLOCATIONS
from hamid.model.booked import booked_record
from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.mig import MigAllocation, decode_mig_allocations, placements_overlap, profile_slice_key
from hamid.model.resources import ResourceConfig
from hamid.plugin.allocator_rules import (
    booked_entries,
    is_unadmitted,
    requests_resource,
    unbooked_mig,
    went_through_hamid,
)
from hamid.plugin.errors import AllocationError
from hamid.plugin.mig_nvml import (
    LiveInstance,
    MigInstanceInUse,
    MigNvmlError,
    busy_reason,
    create_instance,
    destroy_all,
    destroy_instance,
    find_instance,
    live_instances,
)

log = get_logger("plugin.mig")

#: How often managed instances are reconciled with the node's active pods (HAMi: 5 s).
RECONCILE_INTERVAL_S = 5.0
#: Wait between tries to read the pod list at start (nothing is touched until it is read).
START_RETRY_S = 5.0

Key = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class Managed:
    """One instance this plugin owns: its reservation key, what NVML shows, since when (loop
    time; a reconcile whose pod list began earlier never destroys it), and the pod it was handed to
    (:func:`owner_of`). ``owner`` None: found at start with no record naming it (its key names the
    slice group, ``1g``), reclaimed once no running pod's reservation overlaps it."""

    key: Key
    live: LiveInstance
    since: float
    owner: str | None


def owner_of(pod: Mapping[str, Any]) -> str:
    """A pod's identity: its UID (a new pod of the same name is another pod), else its
    ``namespace/name``; the owner of a MIG instance, and the allocator's key of a remembered entry."""
    return objects.uid(pod) or objects.namespaced_key(pod)


def is_active(pod: Mapping[str, object]) -> bool:
    """Whether a pod may still run on its instances: not Succeeded or Failed. A pod being deleted
    stays active until then or until it is gone (its containers run through their grace period,
    and the scheduler keeps its slices booked as long); HAMi counts it ended at once."""
    return objects.section(pod, "status").get("phase") not in ("Succeeded", "Failed")


def pod_reservations(pod: Mapping[str, Any]) -> tuple[MigAllocation, ...]:
    """A pod's reservations: its annotation's (with the runtime ids this plugin added) when they are
    what its status record books or it has none (HAMi's scheduler), else the record's (a tenant's
    rewrite is not followed; no runtime ids then). Raises :class:`InvalidInput` when they cannot
    be read."""
    value = objects.annotations(pod).get(MIG_ALLOCATIONS, "")
    record = booked_record(pod)
    if record is None:
        return decode_mig_allocations(value)
    try:
        annotated = decode_mig_allocations(value)
    except InvalidInput:
        annotated = None
    if annotated is not None and unbooked_mig(pod, annotated) is None:
        return annotated
    return decode_mig_allocations(record.mig)


@dataclass(frozen=True, slots=True)
class Holding:
    """One reservation of an active pod: the pod (``namespace/name``), its owner identity, whether
    it may run on the instance already (admitted by kubelet, or realized), and the record."""

    pod: str
    owner: str
    running: bool
    record: MigAllocation


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A pod whose reservations cannot be read: why, and the GPUs its allocation holds (empty:
    unknown too)."""

    pod: str
    error: str
    gpus: frozenset[str]


@dataclass(frozen=True, slots=True)
class NodeReservations:
    """What the node's active pods reserve, and the pods whose reservations cannot be read."""

    holdings: tuple[Holding, ...]
    unreadable: tuple[Unreadable, ...]

    def known(self, gpu: str) -> bool:
        """Whether every reservation on ``gpu`` is known (an unreadable pod's GPUs are not; all GPUs
        are not when its GPUs cannot be told either)."""
        return not any(not u.gpus or gpu in u.gpus for u in self.unreadable)


def read_reservations(pods: Iterable[Mapping[str, Any]], resource_name: str) -> NodeReservations:
    """The reservations of the active pods that may hold an instance: those the scheduler recorded
    and those that request ``resource_name`` (``Allocate`` serves no other pod, so another pod's
    annotation neither pins an instance nor stops a reclaim). A pod whose reservations cannot be
    read is listed with the GPUs its booked allocation names, whose instances are then kept."""
    holdings: list[Holding] = []
    unreadable: list[Unreadable] = []
    for pod in pods:
        if not is_active(pod) or not (went_through_hamid(pod) or requests_resource(pod, resource_name)):
            continue
        name = objects.namespaced_key(pod)
        try:
            records = pod_reservations(pod)
        except InvalidInput as exc:
            _source, layout = booked_entries(pod)
            gpus = frozenset(d.uuid for entry in layout or () for d in entry)
            unreadable.append(Unreadable(name, str(exc), gpus))
            continue
        admitted = not is_unadmitted(pod)
        holdings.extend(Holding(name, owner_of(pod), admitted or r.realized, r) for r in records)
    return NodeReservations(tuple(holdings), tuple(unreadable))


async def settled(task: asyncio.Future[Any]) -> bool:
    """Wait for ``task`` to end even when cancelled meanwhile; whether a cancel came. For work a
    cancel must not cut in half: an NVML call in a thread (a cancel cannot stop it, and what it
    created must be recorded), the allocator's consume patch and failure path."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


class MigManager:
    """Creates, adopts and destroys this node's MIG instances (the GPUs given: those registered)."""

    def __init__(
        self,
        nvml: ModuleType,
        gpus: Iterable[str],
        list_pods: Callable[[], Awaitable[list[JSON]]],
        *,
        resource_name: str = ResourceConfig().resource_count_name,
        interval: float = RECONCILE_INTERVAL_S,
        retry: float = START_RETRY_S,
    ) -> None:
        self._nvml = nvml
        self._list_pods = list_pods
        self._locks = {uuid: asyncio.Lock() for uuid in gpus}
        self._instances: dict[Key, Managed] = {}
        #: The resource a pod requests to be served (only such pods and recorded ones hold instances).
        self.resource_name = resource_name
        self.interval = interval
        self.retry = retry
        #: The pods whose reservations the last read could not decode (each logged once).
        self._unreadable: frozenset[str] = frozenset()
        #: What happened, by kind (``created``, ``reused``, ``adopted``, ``unowned``, ``destroyed``,
        #: ``destroy_deferred``, ``reset``, ``create_failed``, ``destroy_failed``, ``adopt_failed``,
        #: ``reset_failed``, ``reconcile_skipped``, ``reservation_unreadable``): for metrics and tests.
        self.events: Counter[str] = Counter()

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs this manager owns instances on."""
        return tuple(self._locks)

    def instances(self) -> list[Managed]:
        """The managed instances (a snapshot)."""
        return list(self._instances.values())

    def _lock(self, uuid: str) -> asyncio.Lock:
        lock = self._locks.get(uuid)
        if lock is None:
            raise AllocationError(
                f"GPU {uuid} has no registered MIG capability on this node; delete the pod so the "
                "scheduler places it again",
                code="mig-reservation-invalid",
            )
        return lock

    # -- realize ------------------------------------------------------------------------------

    def _overlapping(self, key: Key) -> list[Managed]:
        """The managed instances sharing a slice with ``key``'s placement, but for an unowned one at
        exactly it (:func:`create_instance` takes that over when idle, as after a plugin died
        between creating and recording)."""
        uuid, _profile, start, size = key
        wanted = MigPlacement(start, size)
        return [
            m
            for m in self._instances.values()
            if m.key not in (key, _unowned_key(key))
            and m.key[0] == uuid
            and placements_overlap(m.live.placement, wanted)
        ]

    async def ensure(self, allocation: MigAllocation, owner: str) -> tuple[LiveInstance, bool]:
        """The instance of a reservation for the pod ``owner`` (:func:`owner_of`), created when there
        is none; whether this call created it.

        An instance another pod was handed, or a managed instance that overlaps, must belong to a
        pod that is gone (the scheduler never reserves the same slices for two active pods): a
        reconcile runs first, and if one is still held, the reservation is refused
        (``mig-placement-busy``), never shared. NVML's refusals are ``mig-create-failed`` with its
        error; nothing this call made is left behind.
        """
        key = allocation.reservation_key
        lock = self._lock(allocation.gpu_uuid)
        current = self._instances.get(key)
        if (current is None and self._overlapping(key)) or (current is not None and current.owner != owner):
            await self.reconcile()
        async with lock:
            now = asyncio.get_running_loop().time()
            managed = self._instances.get(key)
            if managed is not None and managed.owner == owner:  # again: no older list judges it now
                self._instances[key] = dataclasses.replace(managed, since=now)
                return managed.live, False
            busy = [managed] if managed is not None else self._overlapping(key)
            if busy:
                raise AllocationError(
                    f"MIG reservation {allocation.profile} at start {allocation.placement.start} size "
                    f"{allocation.placement.size} on GPU {allocation.gpu_uuid} overlaps instance "
                    f"{busy[0].live.mig_uuid} of an active reservation",
                    code="mig-placement-busy",
                )
            slices = profile_slice_key(allocation.profile)
            creating = asyncio.ensure_future(
                asyncio.to_thread(
                    create_instance, self._nvml, allocation.gpu_uuid, slices, allocation.placement
                )
            )
            cancelled = await settled(creating)
            try:
                live, created = creating.result()
            except MigNvmlError as exc:
                self.events["create_failed"] += 1
                log.error(
                    "mig_instance_create_failed",
                    gpu=allocation.gpu_uuid,
                    profile=allocation.profile,
                    error=str(exc),
                )
                raise AllocationError(
                    f"creating MIG instance {allocation.profile} failed: {exc}", code="mig-create-failed"
                ) from exc
            self._instances.pop(_unowned_key(key), None)  # taken over, or destroyed by a reconcile
            self._instances[key] = Managed(key, live, asyncio.get_running_loop().time(), owner)
        self.events["created" if created else "reused"] += 1
        if cancelled:  # recorded all the same: a retry finds it, a reconcile reclaims it
            raise asyncio.CancelledError
        log.info(
            "mig_instance_created" if created else "mig_instance_taken_over",
            gpu=allocation.gpu_uuid,
            profile=allocation.profile,
            start=allocation.placement.start,
            size=allocation.placement.size,
            mig_uuid=live.mig_uuid,
            gpu_instance_id=live.gpu_instance_id,
            compute_instance_id=live.compute_instance_id,
        )
        return live, created

    async def release(self, key: Key, before: float = math.inf) -> bool:
        """Destroy one managed instance unless it was handed out at ``before`` or later (a reconcile's
        list began then); whether it is gone. A process on it defers the destroy to the next
        reconcile (``destroy_deferred``); another failure is logged and kept for it too."""
        lock = self._locks.get(key[0])
        if lock is None:
            return False
        async with lock:
            managed = self._instances.get(key)
            if managed is None:
                return True
            if managed.since >= before:
                return False
            live = managed.live
            try:
                destroyed = await asyncio.to_thread(destroy_instance, self._nvml, key[0], live)
            except MigInstanceInUse as exc:
                self.events["destroy_deferred"] += 1
                log.info("mig_instance_destroy_deferred_in_use", mig_uuid=live.mig_uuid, error=str(exc))
                return False
            except MigNvmlError as exc:
                self.events["destroy_failed"] += 1
                log.error("mig_instance_destroy_failed", mig_uuid=live.mig_uuid, error=str(exc))
                return False
            del self._instances[key]
        self.events["destroyed"] += 1
        log.info(
            "mig_instance_destroyed" if destroyed else "mig_instance_already_gone",
            gpu=key[0],
            profile=key[1],
            start=key[2],
            mig_uuid=live.mig_uuid,
        )
        return True

    # -- reconcile ----------------------------------------------------------------------------

    async def _read(self) -> NodeReservations:
        """The node's reservations from a fresh pod list (:class:`KubeError` when it fails); each
        pod whose reservations turn unreadable is logged once, naming it and the GPUs kept."""
        reservations = read_reservations(await self._list_pods(), self.resource_name)
        for bad in reservations.unreadable:
            if bad.pod not in self._unreadable:
                self.events["reservation_unreadable"] += 1
                log.error(
                    "mig_reservation_unreadable_instances_kept",
                    pod=bad.pod,
                    error=bad.error,
                    gpus=sorted(bad.gpus) or "all (its allocation cannot be read either)",
                )
        self._unreadable = frozenset(b.pod for b in reservations.unreadable)
        return reservations

    async def reconcile(self) -> bool:
        """Destroy the managed instances no active pod holds; False when skipped (the pod list could
        not be read, or no GPU's reservations are known: nothing is destroyed then). Instances on a
        GPU an unreadable reservation may name are kept."""
        started = asyncio.get_running_loop().time()
        try:
            reservations = await self._read()
        except KubeError as exc:
            self.events["reconcile_skipped"] += 1
            log.warning("mig_reconcile_skipped_nothing_destroyed", error=str(exc))
            return False
        if not any(reservations.known(uuid) for uuid in self.gpus):
            self.events["reconcile_skipped"] += 1
            log.warning("mig_reconcile_skipped_nothing_destroyed", error="no GPU's reservations are known")
            return False
        stale = [
            m.key
            for m in self.instances()
            if m.since < started and reservations.known(m.key[0]) and not _held(m, reservations.holdings)
        ]
        for key in stale:
            await self.release(key, started)
        return True

    async def run(self) -> None:
        """Reconcile every :attr:`interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.reconcile()

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Reset idle GPUs, adopt the realized reservations of active pods and register the other
        instances of the GPUs kept (see the module doc); waits until the pod list can be read."""
        while True:
            try:
                reservations = await self._read()
                break
            except KubeError as exc:
                log.warning(
                    "mig_start_waiting_for_pod_list_nothing_touched", error=str(exc), retry_s=self.retry
                )
                await asyncio.sleep(self.retry)
        in_use = {h.record.gpu_uuid for h in reservations.holdings}
        reset: list[str] = []
        for uuid in self.gpus:
            if not reservations.known(uuid) or uuid in in_use:
                reason = "active reservation" if reservations.known(uuid) else "unreadable reservation"
                log.info("mig_gpu_preserved", gpu=uuid, reason=reason)
                continue
            if await self._reset(uuid):
                reset.append(uuid)
        adopted = 0
        for holding in reservations.holdings:
            if holding.record.realized:
                adopted += await self._adopt_isolated(holding)
        unowned = 0
        for uuid in self.gpus:
            if uuid not in reset:
                unowned += await self._register_unowned(uuid)
        log.info(
            "mig_started",
            in_use=sorted(in_use),
            reset=reset,
            adopted=adopted,
            unowned=unowned,
            unrealized=sum(1 for h in reservations.holdings if not h.record.realized),
        )

    async def _reset(self, uuid: str) -> bool:
        """Destroy every instance on an idle GPU (one with a process on a MIG device is left)."""
        async with self._locks[uuid]:
            busy = await asyncio.to_thread(busy_reason, self._nvml, uuid)
            if busy is not None:
                log.info("mig_gpu_preserved", gpu=uuid, reason=busy)
                return False
            try:
                destroyed = await asyncio.to_thread(destroy_all, self._nvml, uuid)
            except MigNvmlError as exc:
                self.events["reset_failed"] += 1
                log.error("mig_gpu_reset_failed", gpu=uuid, error=str(exc))
                return False
            for key in [k for k in self._instances if k[0] == uuid]:
                del self._instances[key]
        self.events["reset"] += 1
        log.info("mig_gpu_reset", gpu=uuid, destroyed_gpu_instances=destroyed)
        return True

    async def _adopt_isolated(self, holding: Holding) -> int:
        """:meth:`_adopt`, where no failure of one record stops the start (``adopt_failed``)."""
        try:
            return await self._adopt(holding)
        except Exception as exc:  # one bad record must never keep the plugin from starting
            self.events["adopt_failed"] += 1
            mig_uuid = holding.record.mig_uuid
            log.error("mig_instance_not_adopted", pod=holding.pod, mig_uuid=mig_uuid, reason=repr(exc))
            return 0

    async def _adopt(self, holding: Holding) -> int:
        """Adopt one realized record for its pod when NVML confirms its instance (1), else log why (0)."""
        pod, record = holding.pod, holding.record
        assert record.gpu_instance_id is not None and record.compute_instance_id is not None
        expected = LiveInstance(
            record.gpu_instance_id, record.compute_instance_id, record.mig_uuid, record.placement
        )
        lock = self._locks.get(record.gpu_uuid)
        if lock is None:
            log.error(
                "mig_instance_not_adopted", pod=pod, mig_uuid=record.mig_uuid, reason="GPU not registered"
            )
            self.events["adopt_failed"] += 1
            return 0
        async with lock:
            try:
                live = await asyncio.to_thread(
                    find_instance,
                    self._nvml,
                    record.gpu_uuid,
                    profile_slice_key(record.profile),
                    record.placement,
                    expected,
                )
            except MigNvmlError as exc:
                live, reason = False, str(exc)
            else:
                reason = "NVML shows no such instance"
            if not live:
                self.events["adopt_failed"] += 1
                log.error("mig_instance_not_adopted", pod=pod, mig_uuid=record.mig_uuid, reason=reason)
                return 0
            key = record.reservation_key
            self._instances[key] = Managed(key, expected, -math.inf, holding.owner)
        self.events["adopted"] += 1
        log.info(
            "mig_instance_adopted",
            pod=pod,
            mig_uuid=record.mig_uuid,
            gpu=record.gpu_uuid,
            profile=record.profile,
        )
        return 1

    async def _register_unowned(self, uuid: str) -> int:
        """Register the instances of a GPU kept at start that no adopted record names (their pods
        ended while the plugin was down, or they are no pod's), so that a reconcile reclaims each
        once idle and no running pod's reservation overlaps it; how many."""
        async with self._locks[uuid]:
            try:
                found = await asyncio.to_thread(live_instances, self._nvml, uuid)
            except MigNvmlError as exc:
                log.error("mig_instances_not_listed", gpu=uuid, error=str(exc))
                return 0
            owned = {m.live.gpu_instance_id for m in self._instances.values() if m.key[0] == uuid}
            count = 0
            for slices, live in found:
                if live.gpu_instance_id in owned:
                    continue
                key = _unowned_key((uuid, slices, live.placement.start, live.placement.size))
                self._instances[key] = Managed(key, live, -math.inf, None)
                self.events["unowned"] += 1
                log.info(
                    "mig_instance_unowned_registered",
                    gpu=uuid,
                    mig_uuid=live.mig_uuid,
                    start=live.placement.start,
                    size=live.placement.size,
                )
                count += 1
        return count


def _unowned_key(key: Key) -> Key:
    """The key an unowned instance at ``key``'s placement is registered under (its slice group)."""
    uuid, profile, start, size = key
    return (uuid, profile_slice_key(profile), start, size)


def _held(managed: Managed, holdings: Iterable[Holding]) -> bool:
    """Whether an active pod holds a managed instance: its owner still reserves its key; for one with
    no owner, a pod that may run on it reserves slices it covers (an unadopted realized record)."""
    if managed.owner is not None:
        return any(h.owner == managed.owner and h.record.reservation_key == managed.key for h in holdings)
    return any(
        h.running
        and h.record.gpu_uuid == managed.key[0]
        and placements_overlap(h.record.placement, managed.live.placement)
        for h in holdings
    )

"""The dynamic MIG instance manager: the one owner of this node's GPU and compute instances.

The scheduler reserves a GPU, a profile and a placement per MIG device (``hami.io/vgpu-mig-
allocations``); ``Allocate`` asks :meth:`MigManager.ensure` to realize each reservation, exactly
there and never elsewhere. A reservation key (GPU, profile, placement) maps to at most one managed
instance, so a repeated ``Allocate`` converges on the instance already made. The pod annotations
stay the record: an instance whose reservation no active pod holds any more (the pod finished or
was deleted) is destroyed by :meth:`MigManager.reconcile`, periodically and before a creation that
would overlap it, and only from a complete, fresh pod list (a failed read destroys nothing).

At start (:meth:`MigManager.start`, before kubelet can call ``Allocate``): GPUs no active pod
reserves and with no process on a MIG device are reset (every leftover instance destroyed); a GPU
with an active reservation or a process is never touched; realized records of active pods are
verified against NVML and adopted, so a restarted plugin re-creates nothing. Until the pod list
can be read, nothing is touched (the start waits for it).

Per GPU, NVML mutations are serialised (one :class:`asyncio.Lock` each) and run in a thread, as
all of hamid's NVML use does.
"""

from __future__ import annotations

import asyncio
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
from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.mig import MigAllocation, decode_mig_allocations, placements_overlap, profile_slice_key
from hamid.plugin.errors import AllocationError
from hamid.plugin.mig_nvml import (
    LiveInstance,
    MigNvmlError,
    busy_reason,
    create_instance,
    destroy_all,
    destroy_instance,
    find_instance,
)

log = get_logger("plugin.mig")

#: How often managed instances are reconciled with the node's active pods (HAMi: 5 s).
RECONCILE_INTERVAL_S = 5.0
#: Wait between tries to read the pod list at start (nothing is touched until it is read).
START_RETRY_S = 5.0

Key = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class Managed:
    """One instance this plugin owns: its reservation key, what NVML shows, and since when (loop
    time; a reconcile whose pod list began earlier never destroys it)."""

    key: Key
    live: LiveInstance
    since: float


def is_active(pod: Mapping[str, object]) -> bool:
    """HAMi's active pod: not being deleted, not Succeeded or Failed (Pending and Running hold)."""
    phase = objects.section(pod, "status").get("phase")
    return not objects.metadata(pod).get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def active_reservations(pods: Iterable[Mapping[str, object]]) -> list[tuple[str, MigAllocation]]:
    """Every reservation of the active pods, with its pod's ``namespace/name``. Raises
    :class:`InvalidInput` for an annotation that cannot be read: its reservations are unknown, and
    what relies on this list destroys instances."""
    out: list[tuple[str, MigAllocation]] = []
    for pod in pods:
        if not is_active(pod):
            continue
        value = objects.annotations(pod).get(MIG_ALLOCATIONS, "")
        try:
            records = decode_mig_allocations(value)
        except InvalidInput as exc:
            raise InvalidInput(f"pod {objects.namespaced_key(pod)}: {exc}") from exc
        out.extend((objects.namespaced_key(pod), r) for r in records)
    return out


async def _settled(task: asyncio.Future[Any]) -> bool:
    """Wait for ``task`` (an NVML call in a thread, which a cancel cannot stop) to end even when
    cancelled meanwhile, so that what it created is recorded; whether a cancel came."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def key_of(allocation: MigAllocation) -> Key:
    """The reservation key of a record (HAMi's: GPU, profile, placement)."""
    return allocation.reservation_key


class MigManager:
    """Creates, adopts and destroys this node's MIG instances (the GPUs given: those registered)."""

    def __init__(
        self,
        nvml: ModuleType,
        gpus: Iterable[str],
        list_pods: Callable[[], Awaitable[list[JSON]]],
        *,
        interval: float = RECONCILE_INTERVAL_S,
        retry: float = START_RETRY_S,
    ) -> None:
        self._nvml = nvml
        self._list_pods = list_pods
        self._locks = {uuid: asyncio.Lock() for uuid in gpus}
        self._instances: dict[Key, Managed] = {}
        self.interval = interval
        self.retry = retry
        #: What happened, by kind (``created``, ``reused``, ``adopted``, ``destroyed``, ``reset``,
        #: ``create_failed``, ``destroy_failed``, ``adopt_failed``, ``reset_failed``,
        #: ``reconcile_skipped``): for metrics and tests.
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
        uuid, _profile, start, size = key
        wanted = MigPlacement(start, size)
        return [
            m
            for m in self._instances.values()
            if m.key != key and m.key[0] == uuid and placements_overlap(m.live.placement, wanted)
        ]

    async def ensure(self, allocation: MigAllocation) -> tuple[LiveInstance, bool]:
        """The instance of a reservation, created when there is none; whether this call created it.

        A managed instance that overlaps it must belong to a pod that is gone (the scheduler never
        reserves overlapping slices for two active pods): a reconcile runs first, and if one still
        overlaps, the reservation is refused (``mig-placement-busy``). NVML's refusals are
        ``mig-create-failed`` with its error; nothing this call made is left behind.
        """
        key = key_of(allocation)
        lock = self._lock(allocation.gpu_uuid)
        if key not in self._instances and self._overlapping(key):
            await self.reconcile()
        async with lock:
            managed = self._instances.get(key)
            if managed is not None:
                return managed.live, False
            busy = self._overlapping(key)
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
            cancelled = await _settled(creating)
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
            self._instances[key] = Managed(key, live, asyncio.get_running_loop().time())
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

    async def release(self, key: Key) -> bool:
        """Destroy one managed instance; whether it is gone (a failure is logged and kept for the
        next reconcile)."""
        lock = self._locks.get(key[0])
        if lock is None:
            return False
        async with lock:
            managed = self._instances.get(key)
            if managed is None:
                return True
            live = managed.live
            try:
                await asyncio.to_thread(
                    destroy_instance, self._nvml, key[0], live.gpu_instance_id, live.compute_instance_id
                )
            except MigNvmlError as exc:
                self.events["destroy_failed"] += 1
                log.error("mig_instance_destroy_failed", mig_uuid=live.mig_uuid, error=str(exc))
                return False
            del self._instances[key]
        self.events["destroyed"] += 1
        log.info("mig_instance_destroyed", gpu=key[0], profile=key[1], start=key[2], mig_uuid=live.mig_uuid)
        return True

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self) -> bool:
        """Destroy the managed instances no active pod reserves; False when skipped (the pod list
        or an annotation could not be read: nothing is destroyed then)."""
        started = asyncio.get_running_loop().time()
        try:
            active = {key_of(r) for _pod, r in active_reservations(await self._list_pods())}
        except (KubeError, InvalidInput) as exc:
            self.events["reconcile_skipped"] += 1
            log.warning("mig_reconcile_skipped_nothing_destroyed", error=str(exc))
            return False
        stale = [m.key for m in self.instances() if m.key not in active and m.since < started]
        for key in stale:
            await self.release(key)
        return True

    async def run(self) -> None:
        """Reconcile every :attr:`interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.reconcile()

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Reset idle GPUs and adopt the realized reservations of active pods (see the module doc);
        waits until the pod list can be read."""
        while True:
            try:
                pods = await self._list_pods()
                break
            except KubeError as exc:
                log.warning(
                    "mig_start_waiting_for_pod_list_nothing_touched", error=str(exc), retry_s=self.retry
                )
                await asyncio.sleep(self.retry)
        reservations: list[tuple[str, MigAllocation]] = []
        readable = True
        for pod in pods:
            try:
                reservations.extend(active_reservations([pod]))
            except InvalidInput as exc:
                readable = False
                log.error("mig_reservation_unreadable_preserving_all_gpus", error=str(exc))
        in_use = {r.gpu_uuid for _pod, r in reservations}
        reset: list[str] = []
        for uuid in self.gpus:
            if not readable or uuid in in_use:
                log.info(
                    "mig_gpu_preserved", gpu=uuid, reason="active reservation" if readable else "unreadable"
                )
                continue
            if await self._reset(uuid):
                reset.append(uuid)
        adopted = 0
        for owner, record in reservations:
            if record.realized:
                adopted += await self._adopt(owner, record)
        log.info(
            "mig_started",
            in_use=sorted(in_use),
            reset=reset,
            adopted=adopted,
            unrealized=sum(1 for _p, r in reservations if not r.realized),
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

    async def _adopt(self, pod: str, record: MigAllocation) -> int:
        """Adopt one realized record when NVML confirms its instance (1), else log why (0)."""
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
            self._instances[key_of(record)] = Managed(key_of(record), expected, -math.inf)
        self.events["adopted"] += 1
        log.info(
            "mig_instance_adopted",
            pod=pod,
            mig_uuid=record.mig_uuid,
            gpu=record.gpu_uuid,
            profile=record.profile,
        )
        return 1

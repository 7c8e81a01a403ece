"""Pure allocation logic of the device plugin: which pod, which entry, which replicas.

No I/O here: pods are plain wire-form dicts; the async shell (``hamid.plugin.allocator``) feeds
them from the node-scoped caches and writes the results back. What a served container gets
(HAMi-core's environment and mounts) is :mod:`hamid.plugin.hamicore_answer`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hamid.model import objects
from hamid.model.annotations import (
    ALLOCATION_BOOKED_CONDITION,
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    NODE_LOCK,
    VGPU_NODE,
    decode_pod_devices,
    encode_container_devices,
)
from hamid.model.booked import booked_conditions, booked_record
from hamid.model.devices import ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.mig import MigAllocation, reservation_text
from hamid.model.preferred import UuidOf
from hamid.model.quantity import quantity_as_int
from hamid.model.resources import all_containers
from hamid.plugin.errors import AllocationError

Pod = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A not yet consumed, non-empty to-allocate entry and its container index (init first)."""

    index: int
    devices: ContainerDevices


def to_allocate(pod: Pod) -> PodDevices:
    """Decode the pod's ``hami.io/vgpu-devices-to-allocate`` (absent → no entries)."""
    value = objects.annotations(pod).get(DEVICES_TO_ALLOCATE)
    return decode_pod_devices(value, DEVICES_TO_ALLOCATE) if value else ()


def pending_entries(devices: PodDevices) -> list[PendingEntry]:
    """The non-empty entries, each with its original container index."""
    return [PendingEntry(i, entry) for i, entry in enumerate(devices) if entry]


def container_at(pod: Pod, index: int) -> Mapping[str, Any] | None:
    """The container at ``index`` of init containers followed by containers (None if out of range)."""
    containers = all_containers(pod)
    return containers[index] if 0 <= index < len(containers) else None


def is_allocation_candidate(pod: Pod, node_name: str) -> bool:
    """HAMi's candidate rule (docs/hami-wire.md §4.7): Pending, bind-time, allocating/success, here."""
    if objects.metadata(pod).get("deletionTimestamp"):
        return False
    ann = objects.annotations(pod)
    return (
        (pod.get("status") or {}).get("phase") == "Pending"
        and BIND_TIME in ann
        and ann.get(BIND_PHASE) in (BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS)
        and ann.get(VGPU_NODE) == node_name
    )


def has_pending_entry(pod: Pod) -> bool:
    """Whether the pod still has a decodable, non-empty to-allocate entry."""
    try:
        return bool(pending_entries(to_allocate(pod)))
    except InvalidInput:
        return False


def went_through_hamid(pod: Pod) -> bool:
    """Whether hamid's scheduler bound the pod: its ``/bind`` records the booking in the pod's
    status (:mod:`hamid.model.booked`) before the Binding. Tenants cannot write a pod's status, and
    a create starts it empty; a pod's annotations (``vgpu-node``, ``bind-phase``) prove nothing,
    since a pod that skipped the webhook carries them as its creator wrote them."""
    return bool(booked_conditions((pod.get("status") or {}).get("conditions")))


def booked_entries(pod: Pod) -> tuple[str, PodDevices | None]:
    """(where from, the allocation the scheduler booked for the pod, per container): its status
    record's (hamid's /bind and refits write it where tenants cannot), else the
    ``hami.io/vgpu-devices-allocated`` annotation (HAMi's scheduler writes no record); None when
    that does not decode."""
    record = booked_record(pod)
    source, raw = (
        ("the pod's status record", record.allocated)
        if record is not None
        else (DEVICES_ALLOCATED, objects.annotations(pod).get(DEVICES_ALLOCATED) or "")
    )
    try:
        return source, decode_pod_devices(raw, source)
    except InvalidInput:
        return source, None


def refuse_unbooked(entry: PendingEntry, booked: tuple[str, PodDevices | None]) -> None:
    """Refuse to serve a to-allocate entry that is not the one the scheduler booked for its
    container: past admission, a tenant's rewrite between the filter and kubelet's Allocate would
    run the container with limits nobody accounts for (the ledger keeps the booking)."""
    source, layout = booked
    want = layout[entry.index] if layout is not None and entry.index < len(layout) else None
    if want is not None and tuple(want) == tuple(entry.devices):
        return
    shown = "nothing readable" if want is None else encode_container_devices(want)
    raise AllocationError(
        f"container {entry.index}'s pending allocation {encode_container_devices(entry.devices)} is not "
        f"what the scheduler booked for it ({shown}, from {source}): the pod's {DEVICES_TO_ALLOCATE} "
        "was changed after the scheduler wrote it. Delete the pod so the scheduler places it again",
        code="unbooked-allocation",
    )


def unbooked_mig(pod: Pod, records: Sequence[MigAllocation]) -> str | None:
    """The MIG reservations the scheduler booked for the pod (:func:`reservation_text`) when its
    annotation's ``records`` are not them; None when they are, or when the pod has no status
    record (HAMi's scheduler writes none: its annotation is the reservation)."""
    record = booked_record(pod)
    if record is None or reservation_text(records) == record.mig:
        return None
    return record.mig


def refuse_unbooked_mig(pod: Pod, records: Sequence[MigAllocation]) -> None:
    """Refuse MIG reservations that are not the ones the scheduler booked: a tenant who rewrote its
    pod's annotation after the bind would get another profile, placement or GPU than the one booked
    for it, possibly another pod's instance."""
    booked = unbooked_mig(pod, records)
    if booked is None:
        return
    raise AllocationError(
        f"the pod's MIG reservations {reservation_text(records) or 'none'} are not what the scheduler "
        f"booked for it ({booked or 'none'}, from the pod's status record): the pod's {MIG_ALLOCATIONS} was "
        "changed after the scheduler wrote it. Delete the pod so the scheduler places it again",
        code="unbooked-allocation",
    )


def requests_resource(pod: Pod, resource_name: str) -> bool:
    """Whether any container (init first) asks for ``resource_name`` in its limits or requests.

    A value that is not a plain non-negative integer counts as a request (fail closed).
    """
    try:
        containers = all_containers(pod)
    except InvalidInput:
        return True
    for index, container in enumerate(containers):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            values = resources.get(section) or {}
            if not isinstance(values, Mapping) or resource_name not in values:
                continue
            try:
                amount = quantity_as_int(values[resource_name], f"container {index} {section}")
            except InvalidInput:
                return True
            if amount is None or amount > 0:
                return True
    return False


def is_unadmitted(pod: Pod) -> bool:
    """Pending, not being deleted, and not yet admitted by kubelet (which writes container statuses
    right after admission), so kubelet may be calling Allocate for it now. Running, finished and
    admitted-but-starting pods never count."""
    if objects.metadata(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    return (
        status.get("phase", "Pending") == "Pending"
        and not status.get("containerStatuses")
        and not status.get("initContainerStatuses")
    )


def unscheduled_requesters(
    pods: Sequence[Pod], resource_name: str, lock_owner: str | None, served: Collection[str] = ()
) -> list[Pod]:
    """Pods on this node that may be admitted now, request ``resource_name``, and bypassed hamid
    (neither recorded by its ``/bind``, nor the node lock's holder, nor among the pods this plugin
    ``served`` whole, by UID: kubelet may not have written their statuses yet, and a scheduler
    without the record, HAMi's, has given the lock to the next pod).

    kubelet may be calling Allocate for any of them; serving it a hamid pod's allocation would hand
    it another pod's GPUs and limits (I6), so their presence makes identification fail closed.
    """
    return [
        p
        for p in pods
        if not went_through_hamid(p)
        and objects.namespaced_key(p) != lock_owner
        and objects.uid(p) not in served
        and is_unadmitted(p)
        and requests_resource(p, resource_name)
    ]


def unscheduled_error(strangers: Sequence[Pod], resource_name: str) -> AllocationError:
    """The actionable refusal while pods that bypassed hamid wait on this node."""
    names = ", ".join(sorted(objects.namespaced_key(p) for p in strangers))
    return AllocationError(
        f"pod {names} requests {resource_name} but was not bound by hamid's scheduler (no "
        f"{ALLOCATION_BOOKED_CONDITION} condition in its status); "
        "refusing to guess which pod kubelet is admitting. Check the MutatingWebhookConfiguration "
        "(it must set the pod's schedulerName) and the pod's schedulerName, then delete and recreate "
        "that pod",
        code="pod-bypassed-hamid",
    )


def identify_pod(
    pods: Sequence[Pod],
    node_name: str,
    resource_name: str,
    lock_owner: str | None,
    requested: Sequence[str] | None,
    served: Collection[str] = (),
) -> Pod:
    """The pod kubelet is admitting among ``pods`` (this node's pods), or :class:`AllocationError`.

    Refuses while a pod that bypassed hamid may be admitted (:func:`unscheduled_requesters`), then
    picks among the allocation candidates with :func:`choose_pod`.
    """
    strangers = unscheduled_requesters(pods, resource_name, lock_owner, served)
    if strangers:
        raise unscheduled_error(strangers, resource_name)
    candidates = [p for p in pods if is_allocation_candidate(p, node_name) and has_pending_entry(p)]
    return choose_pod(candidates, lock_owner, requested, served)


def choose_pod(
    candidates: Sequence[Pod],
    lock_owner: str | None,
    requested: Sequence[str] | None,
    served: Collection[str] = (),
) -> Pod:
    """Pick the pod kubelet is admitting, or raise :class:`AllocationError` when it cannot be proven.

    ``candidates`` are this node's allocation candidates with a pending entry; ``lock_owner`` the
    ``namespace/name`` in the node lock; ``requested`` the physical UUIDs kubelet asked for (None
    for GetPreferredAllocation, which has no choice yet). The proof is the node lock: the Node
    object is not writable by tenants and the scheduler's ``/bind`` sets it naming the pod it bound,
    so only its holder is served; a pod's own annotations never prove it. The holder is refused too
    when another candidate's next entry names exactly the requested GPUs and the holder's does not:
    guessing swaps pods' limits (upstream #3096). And while another candidate kubelet has not
    admitted yet still waits (the scheduler took the lock from it after it stalled, and kubelet
    may admit it after all), the holder is served only where kubelet's GPUs are exactly its entry
    and no other's: the lock no longer says which of them kubelet is admitting.
    """
    if not candidates:
        raise AllocationError(
            "no pod on this node is waiting for a GPU allocation (bind-phase allocating)", code="no-pod"
        )
    names = ", ".join(sorted(objects.namespaced_key(p) for p in candidates))
    owner = next((p for p in candidates if objects.namespaced_key(p) == lock_owner), None)
    if owner is None:
        raise AllocationError(_unproven_message(lock_owner, names), code="unproven-pod")
    exact: list[Pod] = []
    if requested is not None:
        want = Counter(requested)
        exact = [p for p in candidates if Counter(d.uuid for d in _next_entry(p).devices) == want]
        if owner not in exact and exact:
            others = ", ".join(sorted(objects.namespaced_key(p) for p in exact))
            raise AllocationError(
                f"cannot tell which pod GPUs {sorted(want)} are for: the node lock holder "
                f"{objects.namespaced_key(owner)} waits for other GPUs and {others} wait for these",
                code="ambiguous-pod",
            )
    waiting = [p for p in candidates if p is not owner and is_unadmitted(p) and objects.uid(p) not in served]
    if waiting and exact != [owner]:
        others = ", ".join(sorted(objects.namespaced_key(p) for p in waiting))
        raise AllocationError(
            f"cannot tell which pod kubelet is admitting: the node lock holder "
            f"{objects.namespaced_key(owner)} and {others}, whose lock the scheduler took after it "
            "stalled, both wait for GPUs here; the pod refused is placed again once deleted",
            code="ambiguous-pod",
        )
    return owner


def _unproven_message(lock_owner: str | None, waiting: str) -> str:
    holder = (
        f"the node lock ({NODE_LOCK}) names {lock_owner}, which is not waiting for a GPU allocation here"
        if lock_owner
        else f"no pod holds the node lock ({NODE_LOCK})"
    )
    return (
        f"{holder}; pods {waiting} wait for GPUs, but a pod is served only while it holds the lock the "
        "scheduler's /bind took for it (its own annotations prove nothing). If its bind failed or the "
        "lock expired, delete the pod so the scheduler places it again"
    )


def _next_entry(pod: Pod) -> PendingEntry:
    entries = pending_entries(to_allocate(pod))
    return entries[0]


def allowed_uuids(available: Sequence[str], uuid_of: UuidOf) -> tuple[str, ...]:
    """Unique physical GPUs behind kubelet's available replica IDs, first-seen order (upstream #2817)."""
    seen: dict[str, None] = {}
    for device_id in available:
        uuid = uuid_of(device_id)
        if uuid is not None:
            seen.setdefault(uuid)
    return tuple(seen)


def kubelet_differs(entry: PendingEntry, requested: Sequence[str]) -> bool:
    """Check kubelet's pick for one container; True when its replicas are on other GPUs than the entry.

    ``requested`` are the physical UUIDs behind kubelet's replica IDs (already known to be GPUs of this
    node). Only the count must match the allocation entry: the runtime always gets the entry's GPUs,
    the ones the scheduler accounts for (I1, I2), whatever replicas kubelet picked. Serving kubelet's
    GPUs instead would run the container where no accounting records it (over-commit) and break a
    ``nvidia.com/use-gpuuuid`` pin.
    """
    annotated = entry.devices
    if len(annotated) != len(requested):
        raise AllocationError(
            f"device number not matched: the allocation for container {entry.index} has "
            f"{len(annotated)} GPU(s) {[d.uuid for d in annotated]}, kubelet asked for {len(requested)}",
            code="count-mismatch",
        )
    return Counter(d.uuid for d in annotated) != Counter(requested)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the node knows of one of its GPUs when Allocate serves it."""

    memory_mib: int
    cores: int
    unhealthy_reason: str | None


def refuse_unservable(
    entry: PendingEntry, node_name: str, facts_of: Callable[[str], GpuFacts | None]
) -> None:
    """Refuse an entry the node cannot serve as annotated: a GPU it does not have, a GPU that turned
    unhealthy after the filter (an XID), or amounts beyond the GPU's registered capacity."""
    for device in entry.devices:
        facts = facts_of(device.uuid)
        if facts is None:
            raise AllocationError(
                f"the allocation of container {entry.index} names GPU {device.uuid!r}, which node "
                f"{node_name} does not have; delete the pod so the scheduler places it again",
                code="unknown-gpu",
            )
        if facts.unhealthy_reason is not None:
            raise AllocationError(
                f"GPU {device.uuid} of container {entry.index} turned unhealthy after scheduling "
                f"({facts.unhealthy_reason}); delete the pod so the scheduler places it on a healthy GPU",
                code="unhealthy-gpu",
            )
        if device.usedmem > facts.memory_mib or device.usedcores > facts.cores:
            raise AllocationError(
                f"the allocation of container {entry.index} books {device.usedmem} MiB / {device.usedcores} "
                f"cores on GPU {device.uuid}, beyond its registered {facts.memory_mib} MiB / {facts.cores} "
                "cores; delete the pod so the scheduler places it again",
                code="over-capacity",
            )


def consume(devices: PodDevices, index: int) -> PodDevices:
    """The to-allocate value after entry ``index`` is consumed (emptied; positions are kept)."""
    return tuple(() if i == index else entry for i, entry in enumerate(devices))

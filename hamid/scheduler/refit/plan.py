"""The refit decision, pure: given what the scheduler knows, a plan, a no-op or a refusal.

Rules run in upstream ``RefitNumaAllocation``'s order (docs/refit.md §3 steps 3-13), with
hamid's extra refusals where their facts are first known: pod identity, container, annotations,
no-op, homogeneity, node snapshot and MIG, scheduling annotations, the restricted fit (pins
included), quota, and the annotation splice. Nothing here does I/O or touches scheduler state;
:mod:`hamid.scheduler.refit.commit` applies a plan, :mod:`hamid.scheduler.refit.handler` serves it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from hamid.fit.fit import (
    PodFitSpec,
    Quota,
    Unfit,
    fit_container_restricted,
    is_heterogeneous,
    pod_quota_usage,
)
from hamid.fit.usage import ContainerKind, DeviceAmount, NodeUsage
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.devices import MODE_MIG, NVIDIA, ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.refit import RefitRequest
from hamid.model.resources import ResourceConfig, all_containers

#: Upstream's answer when its caches never synced before the request's context ended; hamid's
#: refusal starts with it (users grep for it) and goes on to say what is not ready.
MSG_NOT_SYNCED = "context cancelled"


class RefusalCode(enum.StrEnum):
    """Every reason a refit is refused; the value is the ``reason`` label of ``hamid_refit_total``."""

    INVALID_REQUEST = "invalid_request"  #: a field of the wrong type, or upstream's stateless checks
    DECODE_ERROR = "decode_error"  #: the body is not JSON
    DEADLINE = "deadline"  #: the refit's deadline passed; nothing changed
    UNAUTHENTICATED = "unauthenticated"  #: the caller did not prove the request's node
    NOT_READY = "not_ready"  #: caches not synced, not the leader
    UNKNOWN_POD = "unknown_pod"  #: the UID is not tracked (or the pod was replaced)
    IDENTITY_MISMATCH = "identity_mismatch"  #: the UID is tracked under another namespace/name
    WRONG_NODE = "wrong_node"  #: the pod is tracked on another node
    NOT_PENDING = "not_pending"  #: nothing (or nothing written yet) to refit for that container
    POD_UNREADABLE = "pod_unreadable"  #: the fresh read of a lagging cached pod failed
    BAD_CONTAINER = "bad_container"  #: index outside the pod, or another container's name
    MIG = "mig"  #: MIG allocations or MIG-mode devices
    BAD_ANNOTATION = "bad_annotation"  #: undecodable allocation or scheduling annotations
    NON_NVIDIA = "non_nvidia"  #: the container reserves other vendors' devices
    HETEROGENEOUS = "heterogeneous"  #: differing amounts per device
    NODE_UNAVAILABLE = "node_unavailable"  #: the node is not registered
    PINNED = "pinned"  #: ``nvidia.com/use-gpuuuid`` names no allowed GPU
    NO_FIT = "no_fit"  #: the restricted fit found no allowed device
    QUOTA = "quota"  #: the moved layout exceeds the namespace quota
    PATCH_CONFLICT = "patch_conflict"  #: 409: the pod changed since it was read
    POD_GONE = "pod_gone"  #: 404 on the patch
    PATCH_FAILED = "patch_failed"  #: another definite patch failure
    PATCH_TIMEOUT = "patch_timeout"  #: the patch's outcome was ambiguous


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal: its code, the caller's ``failureReason``, and whether to record a pod Event."""

    code: RefusalCode
    message: str
    identified: bool = False


@dataclass(frozen=True, slots=True)
class NoOp:
    """The container already holds only allowed GPUs: answer them, change nothing."""

    devices: ContainerDevices


@dataclass(frozen=True, slots=True)
class RefitPlan:
    """What to commit: container ``index`` moves from ``current`` to ``devices``."""

    index: int
    current: ContainerDevices
    devices: ContainerDevices
    layout: PodDevices  #: the pod's positional layout after the move
    new_pending: str  #: ``hami.io/vgpu-devices-to-allocate`` with the entry spliced
    new_allocated: str  #: ``hami.io/vgpu-devices-allocated`` with the entry spliced


class Booking(Protocol):
    """What the scheduler tracks for the pod (its reservation)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def pending(self) -> bool: ...
    @property
    def kinds(self) -> tuple[ContainerKind, ...]: ...
    @property
    def init_released(self) -> bool: ...
    @property
    def applied(self) -> Mapping[str, DeviceAmount]: ...
    @property
    def raw(self) -> str: ...  #: the allocation booked, as ``hami.io/vgpu-devices-allocated`` writes it
    @property
    def mig_text(self) -> str: ...  #: the MIG reservations booked ("" when none)
    @property
    def key(self) -> str: ...


@dataclass(frozen=True, slots=True)
class RefitFacts:
    """Everything the decision reads, gathered by the handler under the node's guard."""

    request: RefitRequest
    booking: Booking | None
    pod: PodBody | None  #: the pod (fresh when the cache lagged behind the booking)
    node: NodeUsage | None  #: the booked node's usage (None: not registered)
    config: ResourceConfig
    gpu_policy: str  #: the scheduler's default GPU policy
    node_policy: str  #: the scheduler's default node policy
    quota: Quota | None  #: the namespace's headroom without this pod


def _q(text: str) -> str:
    """Go's ``%q`` for the strings in refusal messages."""
    return json.dumps(text)


def uuid_list(devices: ContainerDevices) -> str:
    """Go's ``%v`` of a string slice: ``[a b]``."""
    return "[" + " ".join(d.uuid for d in devices) + "]"


def splice_entry(raw: str, index: int, entry: str, what: str) -> str:
    """``raw`` with container ``index``'s entry (``;``-separated) replaced; every other byte kept.

    Raises :class:`InvalidInput` (``cannot rewrite <what> annotation: …``) when the value has no
    non-empty entry at ``index``.
    """
    pieces = raw.split(";")
    if not 0 <= index < len(pieces) or not pieces[index]:
        raise InvalidInput(f"cannot rewrite {what} annotation: container {index} has no entry in {raw!r}")
    pieces[index] = entry
    return ";".join(pieces)


def identify(request: RefitRequest, booking: Booking | None, pod: PodBody | None) -> Refused | None:
    """Upstream step 3, pod identity (plus hamid's "still being written"); None when it holds."""
    if booking is None:
        return Refused(RefusalCode.UNKNOWN_POD, f"pod {request.pod_uid} is not tracked by the scheduler")
    if (booking.namespace, booking.name) != (request.pod_namespace, request.pod_name):
        return Refused(
            RefusalCode.IDENTITY_MISMATCH,
            f"pod {request.pod_uid} does not match {request.pod_namespace}/{request.pod_name}",
        )
    if pod is None or objects.uid(pod) != request.pod_uid:
        return Refused(RefusalCode.UNKNOWN_POD, f"pod {request.pod_uid} is not tracked by the scheduler")
    if booking.node != request.node_name:
        return Refused(
            RefusalCode.WRONG_NODE,
            f"pod {booking.key} is tracked on node {booking.node}, not {request.node_name}",
            identified=True,
        )
    if booking.pending:
        return Refused(
            RefusalCode.NOT_PENDING,
            f"pod {booking.key}: its allocation is still being written",
            identified=True,
        )
    return None


class RefusalError(Exception):
    """A refusal raised where a step finds it (the rules below, the commit, the handler)."""

    def __init__(self, code: RefusalCode, message: str, *, identified: bool = True) -> None:
        super().__init__(message)
        self.refused = Refused(code, message, identified)

    @classmethod
    def of(cls, refused: Refused) -> RefusalError:
        """The error carrying ``refused``."""
        return cls(refused.code, refused.message, identified=refused.identified)


def plan_refit(facts: RefitFacts) -> RefitPlan | NoOp | Refused:
    """Decide one refit from ``facts``; every rule in upstream's order (see the module docs)."""
    refused = identify(facts.request, facts.booking, facts.pod)
    if refused is not None:
        return refused
    try:
        return _plan(facts)
    except RefusalError as exc:
        return exc.refused


@dataclass(frozen=True, slots=True)
class _Allocation:
    """The container's state: pending entries from the pod's annotation, the allocation booked (step 5)."""

    pending_raw: str
    allocated_raw: str
    layout: PodDevices
    current: ContainerDevices


def _check_container(pod: PodBody, index: int, name: str) -> None:
    """Upstream step 4: the index names a container (init first), and its name if given."""
    containers = all_containers(pod)
    if not 0 <= index < len(containers):
        raise RefusalError(
            RefusalCode.BAD_CONTAINER, f"container index {index} is outside the pod's containers"
        )
    actual = str(containers[index].get("name") or "")
    if name and name != actual:
        raise RefusalError(
            RefusalCode.BAD_CONTAINER, f"container index {index} is {_q(actual)}, not {_q(name)}"
        )


def _decode(raw: str, key: str, what: str) -> PodDevices:
    try:
        return ann.decode_pod_devices(raw, key) if raw else ()
    except InvalidInput as exc:
        raise RefusalError(RefusalCode.BAD_ANNOTATION, f"cannot decode {what}: {exc}") from None


def _allocation(pod: PodBody, booked: str, booked_mig: str, index: int) -> _Allocation:
    """Upstream step 5 (with hamid's MIG and vendor refusals): the entries to refit.

    The allocation is the one booked (``booked``), not the pod's annotation: past admission a
    tenant may have rewritten another container's entry there, and the refit would sign it (and
    the ledger book it) along with its own move. Which entries are still pending is the pod's.
    A pod with MIG reservations, booked or annotated, is refused."""
    annotations = objects.annotations(pod)
    if booked_mig or annotations.get(ann.MIG_ALLOCATIONS):
        raise RefusalError(
            RefusalCode.MIG, "the pod holds MIG allocations; the NUMA refit does not support MIG"
        )
    pending_raw = annotations.get(ann.DEVICES_TO_ALLOCATE) or ""
    pending = _decode(pending_raw, ann.DEVICES_TO_ALLOCATE, "pending allocation annotation")
    layout = _decode(booked, ann.DEVICES_ALLOCATED, "booked allocation")
    if index >= len(pending) or not pending[index]:
        raise RefusalError(
            RefusalCode.NOT_PENDING, f"container {index} has no pending {NVIDIA} allocation to refit"
        )
    current = layout[index] if index < len(layout) else ()
    if not current:
        raise RefusalError(RefusalCode.NOT_PENDING, f"container {index} has no recorded {NVIDIA} allocation")
    foreign = sorted({d.type for d in current if d.type != NVIDIA})
    if foreign:
        raise RefusalError(
            RefusalCode.NON_NVIDIA,
            f"container {index} reserves {', '.join(foreign)} devices; the NUMA refit supports only {NVIDIA}",
        )
    return _Allocation(pending_raw, booked, layout, current)


def _check_node(
    node: NodeUsage | None, booking: Booking, current: ContainerDevices, request: RefitRequest
) -> NodeUsage:
    """Upstream step 8: the node is registered; no reserved or allowed device is in MIG mode."""
    if node is None:
        raise RefusalError(RefusalCode.NODE_UNAVAILABLE, f"node {booking.node} unavailable: not registered")
    allowed = request.allowed_device_uuids
    for uuid in [d.uuid for d in current] + list(allowed):
        device = node.by_id.get(uuid)
        if device is not None and device.mode == MODE_MIG:
            what = "reserved" if uuid not in allowed else "allowed"
            raise RefusalError(
                RefusalCode.MIG, f"{what} device {uuid} is in MIG mode; the NUMA refit does not support MIG"
            )
    return node


def _restricted_fit(
    facts: RefitFacts, node: NodeUsage, allocation: _Allocation, allowed: frozenset[str]
) -> tuple[ContainerDevices, PodDevices]:
    """Upstream steps 9-11: the pod's policy, then the fit restricted to the allowed GPUs."""
    booking, index = facts.booking, facts.request.container_index
    assert booking is not None and facts.pod is not None
    try:
        spec = PodFitSpec.from_pod(facts.pod, facts.config, facts.gpu_policy, facts.node_policy)
    except InvalidInput as exc:
        raise RefusalError(RefusalCode.BAD_ANNOTATION, f"invalid pod scheduling annotations: {exc}") from None
    result = fit_container_restricted(
        node,
        allocation.layout,
        booking.kinds,
        index,
        allowed,
        spec.policy,
        init_released=booking.init_released,
        quota=facts.quota,
        booked=booking.applied,
    )
    if not isinstance(result, Unfit):
        return result.devices, result.layout
    pinned = spec.policy.use_uuids
    if pinned is not None and not pinned & allowed:
        # upstream's wording (the fit's CardUuidMismatch), then which pin excluded every GPU
        raise RefusalError(
            RefusalCode.PINNED,
            f"no allowed device fits: {result.reason} (container {index} is pinned by "
            f"{ann.USE_GPU_UUID} to [{' '.join(sorted(pinned))}], none of which is in the allowed set)",
        )
    raise RefusalError(RefusalCode.NO_FIT, f"no allowed device fits: {result.reason}")


def _check_quota(facts: RefitFacts, layout: PodDevices) -> None:
    """Upstream step 12: the moved positional layout within the namespace quota (#2828/#2836).

    hamid's restricted fit already checks the quota phase-aware on the positional layout
    (``ResourceQuotaNotFit``); this is upstream's guard on the result, kept in its place.
    """
    quota, booking = facts.quota, facts.booking
    assert booking is not None
    if quota is None or not quota.limited:
        return
    mem, cores = pod_quota_usage(layout, booking.kinds, booking.init_released)
    if quota.fits(mem, cores):
        return
    over_mem = quota.mem_limit is not None and quota.used_mem + mem > quota.mem_limit
    resource = facts.config.resource_memory_name if over_mem else facts.config.resource_core_name
    raise RefusalError(
        RefusalCode.QUOTA,
        f"refit would exceed the {resource} resource quota in namespace {booking.namespace}",
    )


def _plan(facts: RefitFacts) -> RefitPlan | NoOp:
    """Steps 4-13 once the pod is identified (see :func:`plan_refit`)."""
    request, booking, pod = facts.request, facts.booking, facts.pod
    assert booking is not None and pod is not None
    index = request.container_index
    _check_container(pod, index, request.container_name)
    allocation = _allocation(pod, booking.raw, booking.mig_text, index)
    allowed = frozenset(request.allowed_device_uuids)
    if all(d.uuid in allowed for d in allocation.current):
        return NoOp(allocation.current)
    if is_heterogeneous(allocation.current):
        raise RefusalError(
            RefusalCode.HETEROGENEOUS,
            f"container {index} reserves differing amounts per device; "
            "the refit does not support heterogeneous reservations",
        )
    node = _check_node(facts.node, booking, allocation.current, request)
    devices, layout = _restricted_fit(facts, node, allocation, allowed)
    _check_quota(facts, layout)
    encoded = ann.encode_container_devices(devices)
    try:
        new_pending = splice_entry(allocation.pending_raw, index, encoded, "pending allocation")
        new_allocated = splice_entry(allocation.allocated_raw, index, encoded, "allocated")
    except InvalidInput as exc:
        raise RefusalError(RefusalCode.BAD_ANNOTATION, str(exc)) from None
    return RefitPlan(index, allocation.current, devices, layout, new_pending, new_allocated)

"""The NUMA mismatch policy: what the plugin does when kubelet's devices exclude the annotated GPU.

kubelet reaches the seam through two doors, and both run this one policy:

* ``GetPreferredAllocation`` — kubelet offers replicas restricted to the NUMA node its Topology
  Manager picked, and none of them is on an annotated GPU;
* ``Allocate`` — kubelet skipped ``GetPreferredAllocation`` (the NUMA node holds exactly as many
  free replicas as the container needs, or the plugin does not offer it) and its replicas are on
  other GPUs than the annotated ones. Kubelet's replicas are then its allowed set.

Behaviour matrix (the README's table; MIG-mode nodes never get here):

=============  ==========================================  =====================================
mode           refit enabled                               refit disabled (no endpoint)
=============  ==========================================  =====================================
none/invalid   nothing (invalid: warning, treated as none)  same
best-effort    one refit; on failure the pod runs on its    info log; runs on its annotated GPUs
               annotated GPUs, unaligned (info log)
strict         one refit; on failure the allocation fails   error log only; runs on its annotated
               (gRPC error, bind-phase=failed, lock freed)  GPUs, unaligned
=============  ==========================================  =====================================

The policy answers the replacement devices (committed by the scheduler), None (the annotation
stands and Allocate serves it: the GPUs the scheduler accounts for, whatever replicas kubelet
picked), or raises :class:`~hamid.plugin.errors.AllocationError`. What a replacement means
at each door (an offer to kubelet, or the devices served) is the allocator's business.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hamid.log import get_logger
from hamid.model import objects
from hamid.model.alignment import AlignmentMode, parse_alignment
from hamid.model.devices import NVIDIA, ContainerDevices
from hamid.model.errors import InvalidInput
from hamid.model.refit import RefitRequest
from hamid.plugin.errors import AllocationError
from hamid.plugin.refit_client import RefitClient, RefitError

log = get_logger("plugin.numa_policy")


class Door(enum.StrEnum):
    """The kubelet call in which the mismatch was seen."""

    PREFERRED = "GetPreferredAllocation"
    ALLOCATE = "Allocate"


@dataclass(frozen=True, slots=True)
class NumaMismatch:
    """An annotated GPU is not among kubelet's devices for one container.

    ``container_index`` counts init containers first; ``missing`` are the annotated UUIDs kubelet's
    devices do not cover; ``allowed_uuids`` are the unique physical GPUs behind kubelet's candidate
    replicas (the available ones at ``GetPreferredAllocation``, the allocated ones at ``Allocate``),
    the set a refit is restricted to.
    """

    door: Door
    pod: Mapping[str, Any]
    node_name: str
    container_index: int
    container_name: str
    annotated: ContainerDevices
    missing: tuple[str, ...]
    allowed_uuids: tuple[str, ...]

    @property
    def situation(self) -> str:
        """What kubelet did, in words (the first half of every policy log line)."""
        if self.door is Door.ALLOCATE:
            return "the annotated GPUs are not among kubelet's allocated replicas (no preference asked)"
        return "scheduler-annotated GPU has no replica in kubelet's available devices"


#: The policy's signature (see the module docs); the allocator calls it at both doors.
MismatchHandler = Callable[[NumaMismatch], Awaitable[ContainerDevices | None]]


def alignment_mode(mismatch: NumaMismatch) -> AlignmentMode:
    """The pod's ``hami.io/numa-alignment`` mode; an invalid annotation is logged and treated as none."""
    try:
        return parse_alignment(objects.annotations(mismatch.pod))
    except InvalidInput as exc:
        log.warning(
            "numa_alignment_annotation_invalid_ignored",
            error=str(exc),
            container_index=mismatch.container_index,
        )
        return AlignmentMode.NONE


def log_alignment(mismatch: NumaMismatch, mode: AlignmentMode, event: str, reason: str, **extra: Any) -> None:
    """Log a mismatch outcome by alignment mode (the one place): strict → error, best-effort → info,
    none → nothing. ``reason`` says in words what kubelet did and what follows."""
    if mode is AlignmentMode.NONE:
        return
    emit = log.error if mode is AlignmentMode.STRICT else log.info
    emit(
        event,
        reason=reason,
        numa_alignment=mode.value,
        door=mismatch.door.value,
        container_index=mismatch.container_index,
        annotated=[d.uuid for d in mismatch.annotated],
        missing=list(mismatch.missing),
        available=list(mismatch.allowed_uuids),
        **extra,
    )


async def log_mismatch(mismatch: NumaMismatch) -> ContainerDevices | None:
    """The policy without a refit client: log per the pod's alignment mode; the annotation stands."""
    mode = alignment_mode(mismatch)
    log_alignment(
        mismatch,
        mode,
        "numa_mismatch_refit_disabled",
        f"{mismatch.situation}; "
        + (
            "numa-alignment strict but NUMA refit is disabled"
            if mode is AlignmentMode.STRICT
            else "NUMA refit is disabled, the pod runs unaligned on its annotated GPUs"
        ),
    )
    return None


def refit_request(mismatch: NumaMismatch) -> RefitRequest:
    """The one request sent for a mismatched container (all of kubelet's GPUs allowed, upstream #2817)."""
    pod = mismatch.pod
    return RefitRequest(
        pod_uid=objects.uid(pod),
        pod_namespace=objects.namespace(pod),
        pod_name=objects.name(pod),
        node_name=mismatch.node_name,
        container_index=mismatch.container_index,
        container_name=mismatch.container_name,
        device_type=NVIDIA,
        allowed_device_uuids=mismatch.allowed_uuids,
    )


class NumaMismatchPolicy:
    """The policy with refit: one ``POST /refit`` per mismatch of an opted-in pod."""

    def __init__(self, client: RefitClient) -> None:
        self.client = client

    async def __call__(self, mismatch: NumaMismatch) -> ContainerDevices | None:
        """Replacement devices (committed), None when the annotation stands, or AllocationError."""
        mode = alignment_mode(mismatch)
        if mode is AlignmentMode.NONE:
            return None
        request = refit_request(mismatch)
        try:
            request.validate()
            devices = await self.client.refit(request)
        except (RefitError, InvalidInput) as exc:
            strict = mode is AlignmentMode.STRICT
            outcome = (
                "numa-alignment strict fails the allocation"
                if strict
                else "best-effort runs on the scheduler's allocation without NUMA alignment"
            )
            log_alignment(
                mismatch, mode, "numa_refit_failed", f"NUMA refit failed; {outcome}", error=str(exc)
            )
            if strict:
                raise AllocationError(f"numa-alignment strict: {exc}") from exc
            return None
        log.info(
            "numa_refit_succeeded",
            devices=[d.uuid for d in devices],
            numa_alignment=mode.value,
            door=mismatch.door.value,
            container_index=mismatch.container_index,
            annotated=[d.uuid for d in mismatch.annotated],
            allowed=list(mismatch.allowed_uuids),
        )
        return devices


def make_mismatch_handler(client: RefitClient | None) -> MismatchHandler:
    """The policy to pass as ``Allocator(mismatch_handler=...)`` (``client`` None = refit disabled)."""
    return log_mismatch if client is None else NumaMismatchPolicy(client)

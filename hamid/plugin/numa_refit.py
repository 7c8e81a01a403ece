"""The plugin side of NUMA refit: what GetPreferredAllocation does when kubelet excludes the annotated GPU.

Plugged into :class:`~hamid.plugin.allocate.Allocator` as its mismatch handler. Behaviour matrix
(numa-refit-upstream §5, except what runs after a fallback; MIG-mode nodes never get here, the
allocator skips them):

=============  ==========================================  =====================================
mode           refit enabled                               refit disabled (no endpoint)
=============  ==========================================  =====================================
none/invalid   nothing (invalid: warning, treated as none)  same
best-effort    one refit; on failure the pod runs on its    info log; runs on its annotated GPUs
               annotated GPUs, unaligned (info log)
strict         one refit; on failure the allocation fails   error log only; runs on its annotated
               (gRPC error, bind-phase=failed, lock freed)  GPUs, unaligned
=============  ==========================================  =====================================

Whenever no refit applies (a fallback), the annotation stands and Allocate serves its GPUs, the
ones the scheduler accounts for, whatever replicas kubelet picked (upstream hands the container
kubelet's GPUs instead, which over-commits them). GetPreferredAllocation then answers one replica per
distinct physical GPU (must-include first, then the GPUs with the most available replicas) so that
kubelet's replica bookkeeping keeps one slot per GPU; "no preference" only when that is impossible.
A committed refit returns the new devices; if kubelet cannot honour them the allocator fails the
allocation in every mode. After a commit the pod is re-read (GET), so ``Allocate`` consumes the
refitted entry even when the plugin's watch cache lags.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from hamid.kube.client import JSON
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.alignment import AlignmentMode
from hamid.model.devices import NVIDIA, ContainerDevices
from hamid.model.errors import InvalidInput
from hamid.model.refit import RefitRequest
from hamid.plugin.allocate import PreferredMismatch, alignment_mode, log_alignment, log_mismatch
from hamid.plugin.allocation import AllocationError
from hamid.plugin.refit_client import RefitClient, RefitError

log = get_logger("plugin.numa_refit")

#: Re-reads one pod (the plugin's ``NodePods.fetch_pod``: a GET whose answer overlays the cache).
FetchPod = Callable[[str, str], Awaitable[JSON | None]]


def refit_request(mismatch: PreferredMismatch) -> RefitRequest:
    """The one request sent for a mismatched container (all available GPUs allowed, upstream #2817)."""
    meta = mismatch.pod.get("metadata") or {}
    return RefitRequest(
        pod_uid=str(meta.get("uid") or ""),
        pod_namespace=str(meta.get("namespace") or ""),
        pod_name=str(meta.get("name") or ""),
        node_name=mismatch.node_name,
        container_index=mismatch.container_index,
        container_name=mismatch.container_name,
        device_type=NVIDIA,
        allowed_device_uuids=mismatch.allowed_uuids,
    )


class NumaRefitHandler:
    """The allocator's mismatch handler: refit per the pod's ``hami.io/numa-alignment`` mode."""

    def __init__(self, client: RefitClient | None, fetch_pod: FetchPod | None = None) -> None:
        self.client = client
        self.fetch_pod = fetch_pod

    async def __call__(self, mismatch: PreferredMismatch) -> ContainerDevices | None:
        """Replacement devices (committed), None when the annotation stands, or AllocationError."""
        if self.client is None:
            return await log_mismatch(mismatch)
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
            log_alignment(mismatch, mode, f"NUMA refit failed; {outcome}", error=str(exc))
            if strict:
                raise AllocationError(f"numa-alignment strict: {exc}") from exc
            return None
        log.info(
            "NUMA refit succeeded",
            devices=[d.uuid for d in devices],
            numa_alignment=mode.value,
            container_index=mismatch.container_index,
            annotated=[d.uuid for d in mismatch.annotated],
            allowed=list(mismatch.allowed_uuids),
        )
        await self._reread(request)
        return devices

    async def _reread(self, request: RefitRequest) -> None:
        """GET the pod after a commit so Allocate reads the refitted entry (the watch may lag)."""
        if self.fetch_pod is None:
            return
        try:
            await self.fetch_pod(request.pod_namespace, request.pod_name)
        except KubeError as exc:
            log.warning(
                "cannot re-read the pod after NUMA refit; Allocate relies on its resourceVersion guard",
                error=str(exc),
            )


def make_mismatch_handler(client: RefitClient | None, fetch_pod: FetchPod | None = None) -> NumaRefitHandler:
    """The handler to pass as ``Allocator(mismatch_handler=...)`` (``client`` None = refit disabled)."""
    return NumaRefitHandler(client, fetch_pod)

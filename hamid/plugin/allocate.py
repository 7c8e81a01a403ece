"""The plugin's GetPreferredAllocation and Allocate logic against the API server (async shell).

One :class:`Allocator` per plugin process; calls are serialised (kubelet admits pods one at a time,
and every decision reads the state the previous one wrote).

Allocate always serves the GPUs of the pod's (possibly refitted) allocation annotation, the ones the
scheduler accounts for, so runtime == annotations == accounting in every mode (I1, I2). kubelet's
replica IDs are checked for count and validity only; when they are on other GPUs (a fallback after
a refused, failed or disabled refit, or GetPreferredAllocation off) a warning names both sets.
Unlike upstream the container never follows kubelet's GPUs: that would run it where no accounting
records it.
"""

from __future__ import annotations

import asyncio
import os
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from hamid.kube.client import JSON, KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound
from hamid.log import get_logger
from hamid.model import hamicore
from hamid.model.alignment import AlignmentMode, parse_alignment
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    NUMA_ALIGNMENT,
    encode_pod_devices,
)
from hamid.model.devices import ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.plugin.allocation import (
    AllocationError,
    ContainerAnswer,
    HamiCoreSettings,
    allowed_uuids,
    annotations_of,
    choose_pod,
    consume,
    container_at,
    distinct_gpu_preference,
    hami_core_answer,
    has_pending_entry,
    is_allocation_candidate,
    kubelet_differs,
    pending_entries,
    pod_key,
    select_preferred,
    to_allocate,
)
from hamid.plugin.inventory import Inventory
from hamid.plugin.pods import NodePods

log = get_logger("plugin.allocate")

#: How often Allocate re-reads and retries when its resourceVersion-guarded patch conflicts.
CONFLICT_RETRIES = 3


@dataclass(frozen=True, slots=True)
class PreferredMismatch:
    """An annotated GPU has no replica among kubelet's available devices (the NUMA-refit seam).

    ``container_index`` counts init containers first; ``missing`` are the annotated UUIDs without
    an available replica; ``allowed_uuids`` the unique physical GPUs behind ``available_ids``.
    """

    pod: Mapping[str, Any]
    node_name: str
    container_index: int
    container_name: str
    annotated: ContainerDevices
    missing: tuple[str, ...]
    available_ids: tuple[str, ...]
    must_include_ids: tuple[str, ...]
    allocation_size: int
    allowed_uuids: tuple[str, ...]


#: Replacement devices (already committed by the scheduler), None for "no replacement" (the annotation
#: stands and Allocate serves it, without NUMA alignment), or raise
#: :class:`~hamid.plugin.allocation.AllocationError` to fail the allocation.
MismatchHandler = Callable[[PreferredMismatch], Awaitable[ContainerDevices | None]]


async def log_mismatch(mismatch: PreferredMismatch) -> ContainerDevices | None:
    """Default mismatch handler (no refit client): log per the pod's alignment mode; the annotation stands."""
    fields = {
        "container_index": mismatch.container_index,
        "annotated": [d.uuid for d in mismatch.annotated],
        "missing": list(mismatch.missing),
        "available": list(mismatch.allowed_uuids),
    }
    try:
        mode = parse_alignment(annotations_of(mismatch.pod))
    except InvalidInput as exc:
        log.warning("ignoring invalid numa-alignment annotation", error=str(exc), **fields)
        return None
    if mode is AlignmentMode.STRICT:
        log.error(
            "scheduler-annotated GPU has no replica in kubelet's available devices; "
            "numa-alignment strict but NUMA refit is disabled",
            numa_alignment=mode.value,
            **fields,
        )
    elif mode is AlignmentMode.BEST_EFFORT:
        log.info(
            "scheduler-annotated GPU has no replica in kubelet's available devices",
            numa_alignment=mode.value,
            **fields,
        )
    return None


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of a GetPreferredAllocation call."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _make_dirs(paths: Sequence[str]) -> None:
    for path in paths:
        os.makedirs(path, exist_ok=True)
        try:
            os.chmod(path, 0o777)
        except PermissionError:
            log.debug("cannot chmod directory (not the owner)", path=path)


class Allocator:
    """Answers GetPreferredAllocation and Allocate for one node from its pending pod's annotations."""

    def __init__(
        self,
        client: KubeClient,
        pods: NodePods,
        inventory: Inventory,
        hami: HamiCoreSettings,
        *,
        mismatch_handler: MismatchHandler = log_mismatch,
        call_timeout: float = 5.0,
        preferred_allocation: bool = True,
    ) -> None:
        self.client = client
        # Without GetPreferredAllocation kubelet's replica pick is arbitrary, so a differing pick is
        # expected (info); with it, a difference means the preference was not honoured (warning).
        self._log_differing_pick = log.warning if preferred_allocation else log.info
        self.pods = pods
        self.node_name = pods.node_name
        self.inventory = inventory
        self.hami = hami
        self.mismatch_handler = mismatch_handler
        self.call_timeout = call_timeout
        self._lock = asyncio.Lock()

    # -- identify the pod ----------------------------------------------------------------------

    async def _identify(self, requested: Sequence[str] | None) -> JSON:
        """The pending pod kubelet is admitting (node lock owner first), or AllocationError."""
        try:
            async with asyncio.timeout(self.call_timeout):
                await self.pods.wait_synced()
        except TimeoutError as exc:
            raise AllocationError(f"the pod cache of node {self.node_name} is not synced yet") from exc
        candidates = [
            p for p in self.pods.pods() if is_allocation_candidate(p, self.node_name) and has_pending_entry(p)
        ]
        owner = self.pods.lock_owner()
        if owner is not None and all(pod_key(p) != owner for p in candidates):
            namespace, _, name = owner.partition("/")
            fetched = await self.pods.fetch_pod(namespace, name)
            if (
                fetched is not None
                and is_allocation_candidate(fetched, self.node_name)
                and has_pending_entry(fetched)
            ):
                candidates.append(fetched)
        return dict(choose_pod(candidates, owner, requested))

    # -- GetPreferredAllocation --------------------------------------------------------------

    async def preferred(self, requests: Sequence[PreferredRequest]) -> list[list[str]]:
        """One list of replica IDs per request; an empty list means "no opinion"."""
        async with self._lock:
            try:
                pod = await self._identify(None)
                entries = pending_entries(to_allocate(pod))
            except (AllocationError, InvalidInput, KubeError) as exc:
                log.info("no preferred allocation", node=self.node_name, reason=str(exc))
                return [[] for _ in requests]
            with structlog.contextvars.bound_contextvars(pod=pod_key(pod), node=self.node_name):
                out: list[list[str]] = []
                for i, request in enumerate(requests):
                    out.append(
                        await self._preferred_one(pod, entries[i] if i < len(entries) else None, request)
                    )
                return out

    async def _preferred_one(self, pod: JSON, entry: Any, request: PreferredRequest) -> list[str]:
        if entry is None:
            return []
        uuid_of = self.inventory.uuid_of
        chosen, missing = select_preferred(
            entry.devices, request.available, request.must_include, request.size, uuid_of
        )
        if missing:
            if self.inventory.is_mig:
                return []
            container = container_at(pod, entry.index) or {}
            mismatch = PreferredMismatch(
                pod=pod,
                node_name=self.node_name,
                container_index=entry.index,
                container_name=str(container.get("name", "")),
                annotated=entry.devices,
                missing=tuple(missing),
                available_ids=request.available,
                must_include_ids=request.must_include,
                allocation_size=request.size,
                allowed_uuids=allowed_uuids(request.available, uuid_of),
            )
            try:
                replacement = await self.mismatch_handler(mismatch)
            except AllocationError as exc:
                await self._fail(pod, str(exc))
                raise
            if replacement is None:
                return self._fallback(entry.index, chosen, request)
            chosen, still = select_preferred(
                replacement, request.available, request.must_include, request.size, uuid_of
            )
            if still or len(chosen) != request.size:
                message = (
                    "numa refit committed but kubelet cannot honor the selection: "
                    f"{[d.uuid for d in replacement]} not among the available devices"
                )
                await self._fail(pod, message)
                raise AllocationError(message)
        if len(chosen) != request.size:
            log.info(
                "allocation annotation does not fill the request; no preference",
                container_index=entry.index,
                annotated=len(entry.devices),
                size=request.size,
            )
            return []
        return chosen

    def _fallback(self, index: int, partial: Sequence[str], request: PreferredRequest) -> list[str]:
        """No replacement: prefer one replica per distinct GPU, for kubelet's replica bookkeeping.

        Allocate serves the annotated GPUs whatever kubelet picks; distinct GPUs keep kubelet's
        per-GPU replica counts shaped like the allocation (one slot per GPU). ``partial``
        (must-include replicas plus the annotated GPUs that are still available) is kept when
        possible; "no preference" only when the size cannot be met with distinct GPUs.
        """
        uuid_of = self.inventory.uuid_of
        chosen = distinct_gpu_preference(request.available, partial, request.size, uuid_of)
        if not chosen and list(partial) != list(request.must_include):
            chosen = distinct_gpu_preference(request.available, request.must_include, request.size, uuid_of)
        log.info(
            "annotated GPUs not offered; preferring replicas on distinct GPUs"
            if chosen
            else "annotated GPUs not offered; no distinct-GPU preference possible",
            container_index=index,
            preferred=chosen,
            size=request.size,
            allocate_serves="annotation",
        )
        return chosen

    # -- Allocate -------------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        """Serve one Allocate call (one answer per request) or raise AllocationError (pod marked failed)."""
        if not requests:
            raise AllocationError("Allocate called without container requests")
        async with self._lock:
            first = [self.inventory.uuid_of(i) for i in requests[0]]
            known = None if None in first else [u for u in first if u is not None]
            pod = await self._identify(known)
            with structlog.contextvars.bound_contextvars(pod=pod_key(pod), node=self.node_name):
                try:
                    return await self._allocate_for(pod, requests)
                except AllocationError as exc:
                    await self._fail(pod, str(exc))
                    raise
                except InvalidInput as exc:
                    await self._fail(pod, str(exc))
                    raise AllocationError(str(exc)) from exc
                except KubeError as exc:
                    message = f"API server call failed while allocating: {exc}"
                    await self._fail(pod, message)
                    raise AllocationError(message) from exc

    def _plan(
        self, pod: JSON, requests: Sequence[Sequence[str]]
    ) -> tuple[list[tuple[int, ContainerDevices]], PodDevices]:
        unknown = sorted({i for r in requests for i in r if self.inventory.uuid_of(i) is None})
        if unknown:
            raise AllocationError(
                f"unknown device IDs {unknown}: not replicas of GPUs advertised on node {self.node_name}"
            )
        if self.inventory.is_mig:
            raise AllocationError(
                f"node {self.node_name} is in mig operating mode; hamid does not create MIG instances"
            )
        devices = to_allocate(pod)
        plans: list[tuple[int, ContainerDevices]] = []
        for ids in requests:
            entries = pending_entries(devices)
            if not entries:
                raise AllocationError(f"pod {pod_key(pod)} has no GPU allocation left for this container")
            entry = entries[0]
            requested = [u for u in (self.inventory.uuid_of(i) for i in ids) if u is not None]
            if kubelet_differs(entry, requested):
                self._log_differing_pick(
                    "kubelet's replicas are on other GPUs than the allocation annotation; the runtime "
                    "follows the scheduler's accounting (the annotated GPUs), NUMA alignment was not "
                    "achieved for best-effort pods",
                    container_index=entry.index,
                    annotated=[d.uuid for d in entry.devices],
                    kubelet=requested,
                    kubelet_ids=list(ids),
                    numa_alignment=annotations_of(pod).get(NUMA_ALIGNMENT, ""),
                )
            plans.append((entry.index, entry.devices))
            devices = consume(devices, entry.index)
        return plans, devices

    async def _allocate_for(self, pod: JSON, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for _attempt in range(CONFLICT_RETRIES):
            plans, remaining = self._plan(pod, requests)
            answers = [
                hami_core_answer(
                    devs, meta.get("uid", ""), container_at(pod, idx), self.hami, uuidlib.uuid4().hex
                )
                for idx, devs in plans
            ]
            await self._host_dirs(answers)
            done = not pending_entries(remaining)
            patch: dict[str, str | None] = {DEVICES_TO_ALLOCATE: encode_pod_devices(remaining)}
            if done:
                patch[BIND_PHASE] = BIND_PHASE_SUCCESS
            try:
                patched = await self.client.patch_pod_metadata(
                    namespace,
                    name,
                    annotations=patch,
                    resource_version=meta.get("resourceVersion"),
                    timeout=self.call_timeout,
                )
            except Conflict:
                fresh = await self.pods.fetch_pod(namespace, name)
                if fresh is None or not is_allocation_candidate(fresh, self.node_name):
                    raise AllocationError(
                        f"pod {namespace}/{name} changed while allocating and is no longer pending"
                    ) from None
                pod, meta = fresh, fresh["metadata"]
                continue
            self.pods.remember(patched)
            for idx, devs in plans:
                log.info(
                    "allocated",
                    container_index=idx,
                    devices=[d.uuid for d in devs],
                    memory=[d.usedmem for d in devs],
                    cores=devs[0].usedcores,
                )
            if done:
                await self._release_lock(f"{namespace}/{name}")
            return answers
        raise AllocationError(
            f"pod {namespace}/{name} kept changing while allocating ({CONFLICT_RETRIES} conflicts)"
        )

    async def _host_dirs(self, answers: Sequence[ContainerAnswer]) -> None:
        paths = [a.cache_dir for a in answers] + [hamicore.VGPU_LOCK_DIR]
        try:
            await asyncio.to_thread(_make_dirs, paths)
        except OSError as exc:
            raise AllocationError(f"cannot create HAMi-core directories {paths}: {exc}") from exc

    # -- failure and the node lock -----------------------------------------------------------------

    async def _fail(self, pod: JSON, reason: str) -> None:
        """Mark the pod ``bind-phase=failed`` and release the node lock if it holds it (best effort)."""
        meta = pod.get("metadata") or {}
        log.error("allocation failed", reason=reason)
        try:
            patched = await self.client.patch_pod_metadata(
                meta.get("namespace", ""),
                meta.get("name", ""),
                annotations={BIND_PHASE: BIND_PHASE_FAILED},
                timeout=self.call_timeout,
            )
            self.pods.remember(patched)
        except KubeError as exc:
            log.error("cannot mark pod bind-phase failed", error=str(exc))
        await self._release_lock(pod_key(pod))

    async def _release_lock(self, owner: str) -> None:
        """Remove the node lock only if ``owner`` holds it (resourceVersion-guarded, one retry)."""
        for _attempt in range(2):
            node = self.pods.node()
            try:
                if node is None or _attempt:
                    node = await self.pods.fetch_node()
                if self.pods.lock_owner(node) != owner:
                    return
                await self.client.patch_node_metadata(
                    self.node_name,
                    annotations={NODE_LOCK: None},
                    resource_version=node["metadata"].get("resourceVersion"),
                    timeout=self.call_timeout,
                )
                log.info("node lock released", owner=owner)
                return
            except Conflict:
                continue
            except (NotFound, KubeError) as exc:
                log.error("cannot release node lock", owner=owner, error=str(exc))
                return
        log.error("cannot release node lock: node kept changing", owner=owner)

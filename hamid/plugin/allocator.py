"""The allocator service: GetPreferredAllocation and Allocate against the API server (async shell).

One :class:`Allocator` per plugin process; calls are serialised (kubelet admits pods one at a time,
and every decision reads the state the previous one wrote). The rules it applies are pure
(:mod:`hamid.plugin.allocator_rules`); a NUMA mismatch goes to the one policy
(:mod:`hamid.plugin.numa_policy`), from either door:

* ``GetPreferredAllocation``: no available replica is on an annotated GPU. A replacement is offered
  to kubelet; without one, replicas on distinct GPUs are (the fallback).
* ``Allocate``: kubelet's replicas are on other GPUs than the annotated ones and the policy has not
  run for that container yet (kubelet skips ``GetPreferredAllocation`` when the NUMA node holds
  exactly the replicas needed, or when the plugin does not offer it). A replacement must be exactly
  kubelet's GPUs; it is served after one GET of the refitted pod.

Without a replacement Allocate serves the GPUs of the pod's allocation annotation, the ones the
scheduler accounts for, so runtime == annotations == accounting in every mode (I1, I2). Unlike
upstream the container never follows kubelet's GPUs: that would run it where no accounting records
it. A fallback is remembered per container (bounded) so that Allocate does not run the policy again
for it; after a plugin restart in between, Allocate runs it once more.

Identity (I6): only the pod named by the node lock is served (the scheduler's ``/bind`` takes it;
tenants cannot write the Node). It comes from the watch caches (one fresh GET node + LIST pods
before refusing, in case the watches lag). While a Pending, not yet admitted pod on the node
requests the resource without having gone through hamid, every call refuses (GetPreferredAllocation:
no opinion, no refit), because kubelet may be admitting that pod; no hamid pod is marked. Annotated
GPUs the node does not have, that turned unhealthy, or booked beyond their capacity are refused.
Every refusal is counted by code (:attr:`Allocator.refusals`). Deadlines: the work before
Allocate's commit (the second door's refit included) runs within ``prepare_timeout`` (past it: the
failure path); the commit patch with its lock release and the failure path always complete
(:func:`complete`).

On a ``mig`` mode node the same identification, entries and commit serve MIG pods: instead of
HAMi-core's answer, each container's reservations (``hami.io/vgpu-mig-allocations``) are realized
by the :class:`~hamid.plugin.mig_manager.MigManager`, the answer names the MIG devices, and the
commit patch adds their runtime ids to the reservation records; a failed Allocate destroys the
instances it created. Such a node never runs the NUMA mismatch policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid as uuidlib
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError
from hamid.kube.retry import RetryBudget, write_retrying
from hamid.log import get_logger
from hamid.model import hamicore, nodelock, objects
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    NUMA_ALIGNMENT,
    encode_pod_devices,
)
from hamid.model.devices import ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, NodeBody
from hamid.model.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hamid.model.preferred import distinct_gpu_preference, preferred_answer, select_preferred
from hamid.model.resources import ResourceConfig
from hamid.plugin.allocator_rules import (
    PendingEntry,
    allowed_uuids,
    booked_entries,
    consume,
    container_at,
    has_pending_entry,
    identify_pod,
    is_allocation_candidate,
    kubelet_differs,
    pending_entries,
    refuse_unbooked,
    refuse_unbooked_mig,
    refuse_unservable,
    to_allocate,
)
from hamid.plugin.cdi_specs import CdiScan, CdiSpecs
from hamid.plugin.device_lists import DeviceLists
from hamid.plugin.device_nodes import (
    CONTROL_NODES,
    MIG_MINORS,
    MIG_MINORS_LIMIT,
    DeviceNodes,
    gpu_nodes,
    mig_nodes,
    parse_mig_minors,
)
from hamid.plugin.errors import AllocationError, summarize
from hamid.plugin.hamicore_answer import ContainerAnswer, HamiCoreSettings, hami_core_answer
from hamid.plugin.hostfiles import read_text
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.mig_manager import Key, MigManager, owner_of, settled
from hamid.plugin.numa_policy import Door, MismatchHandler, NumaMismatch, log_mismatch
from hamid.plugin.pods import NodePods

log = get_logger("plugin.allocator")

#: How often Allocate re-reads and retries when its resourceVersion-guarded patch conflicts.
CONFLICT_RETRIES = 3
#: Timeout of each API call the allocator makes (GET, LIST, PATCH).
CALL_TIMEOUT_S = 3.0
#: Budget of everything before an Allocate commits (identification, second door, plan, host
#: directories) and of GetPreferredAllocation's identification. Past it, Allocate runs the failure path.
PREPARE_TIMEOUT_S = 10.0
#: How long an entry its status record does not name yet is read again (first after
#: ``BOOKED_RECORD_POLL_S``, doubling) before it is refused: a refit's record follows its patch.
BOOKED_RECORD_WAIT_S = 4.0
BOOKED_RECORD_POLL_S = 0.1
#: Transient API failures (429, 5xx, timeouts) one Allocate's commit patches may retry, in all.
TRANSIENT_RETRIES = 3
#: API calls that may follow the prepare deadline: every commit patch (one per conflict retry), then
#: marking the pod failed (one) or releasing the node lock (two attempts of GET + PATCH); each
#: transient retry adds a read-back and a patch.
CALLS_AFTER_PREPARE = CONFLICT_RETRIES + 1 + 4 + 2 * TRANSIENT_RETRIES
#: Containers whose fallback the allocator remembers between its two doors (oldest forgotten first).
FALLBACK_MEMORY = 512

T = TypeVar("T")


async def complete(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end even when the caller is cancelled meanwhile, then re-raise the cancel.

    Like :func:`asyncio.shield`, but the caller also waits for the shielded work (so it stays owned).
    For writes that must not be cut in half: the consume patch with its lock release, and the
    failure path. Every call inside has its own timeout, so this always ends.
    """
    task = asyncio.ensure_future(coro)
    if await settled(task):
        if not task.cancelled() and task.exception() is not None:
            log.error("write_failed_after_cancel", error=str(task.exception()))
        raise asyncio.CancelledError
    return task.result()


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of a GetPreferredAllocation call."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _of_container(records: Sequence[MigAllocation], index: int) -> list[MigAllocation]:
    """The MIG reservations of container ``index``, in device order."""
    return sorted((r for r in records if r.container_index == index), key=lambda r: r.device_index)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One Allocate's plan before its commit: each served container's entry, the to-allocate value
    after them, the answers, and further annotations the commit writes (MIG runtime ids)."""

    plans: list[tuple[int, ContainerDevices]]
    remaining: PodDevices
    answers: list[ContainerAnswer]
    notes: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What one Allocate learned on the host: whether HAMi-core's license exists, which of the
    device nodes looked up exist, and what the CDI spec directories define (None: not read)."""

    licensed: bool
    present: frozenset[str]
    cdi: CdiScan | None


def _prepare_host(
    cache_dirs: Sequence[str],
    license_path: str,
    device_nodes: DeviceNodes | None,
    wanted: Sequence[str],
    cdi_specs: CdiSpecs | None,
) -> HostFacts:
    """Create the containers' cache directories and HAMi-core's lock directory (world-writable, as
    HAMi does); whether ``<HOOK_PATH>/vgpu/license`` exists (HAMi then mounts it), which of the
    ``wanted`` device nodes exist (none looked up without ``device_nodes``), and the CDI devices the
    spec directories define (when named through CDI). Run in a thread.
    """
    for path in [*cache_dirs, hamicore.VGPU_LOCK_DIR]:
        os.makedirs(path, exist_ok=True)
        try:
            os.chmod(path, 0o777)
        except PermissionError:
            log.debug("chmod_skipped_not_owner", path=path)
    present = device_nodes.present(wanted) if device_nodes is not None else frozenset()
    scan = cdi_specs.scan() if cdi_specs is not None else None
    return HostFacts(os.path.exists(license_path), present, scan)


class EntryMemory:
    """Containers' entries this plugin decided on: those for which the mismatch policy kept the
    annotation (so Allocate does not run it again), or those a refit it asked for replaced.

    Keyed by (pod UID, container index) with the entry (a changed entry is a new case); bounded
    (:data:`FALLBACK_MEMORY`, oldest forgotten first); an entry goes once consumed.
    """

    def __init__(self, size: int = FALLBACK_MEMORY) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, int], ContainerDevices] = OrderedDict()

    @staticmethod
    def _key(pod: Mapping[str, Any], index: int) -> tuple[str, int]:
        return owner_of(pod), index

    def remember(self, pod: Mapping[str, Any], index: int, devices: ContainerDevices) -> None:
        """Container ``index``'s entry is ``devices``, as this plugin decided."""
        key = self._key(pod, index)
        self._kept[key] = tuple(devices)
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def holds(self, pod: Mapping[str, Any], entry: PendingEntry) -> bool:
        """Whether this is exactly the entry remembered for its container."""
        return self._kept.get(self._key(pod, entry.index)) == tuple(entry.devices)

    def forget(self, pod: Mapping[str, Any], index: int) -> None:
        """The entry was consumed."""
        self._kept.pop(self._key(pod, index), None)


class Allocator:
    """Answers GetPreferredAllocation and Allocate for one node from its pending pod's annotations."""

    def __init__(
        self,
        client: KubeClient,
        pods: NodePods,
        inventory: GpuInventory,
        hami: HamiCoreSettings,
        *,
        resource_name: str = ResourceConfig().resource_count_name,
        mismatch_handler: MismatchHandler = log_mismatch,
        call_timeout: float = CALL_TIMEOUT_S,
        prepare_timeout: float = PREPARE_TIMEOUT_S,
        preferred_allocation: bool = True,
        on_allocated: Callable[[str, list[str]], None] | None = None,
        device_nodes: DeviceNodes | None = None,
        device_lists: DeviceLists | None = None,
        cdi_specs: CdiSpecs | None = None,
        on_cdi_scan: Callable[[CdiScan], None] | None = None,
        mig: MigManager | None = None,
    ) -> None:
        self.client = client
        #: Realizes the MIG reservations of a ``mig`` mode node (None: not one, or no NVML to do it).
        self.mig = mig
        #: The driver's MIG capability minors, read for the DeviceSpecs of MIG devices.
        self.mig_minors = MIG_MINORS
        #: The MIG instances the Allocate in progress created: destroyed again when it fails.
        self._mig_created: list[Key] = []
        #: Where the device nodes declared as DeviceSpecs are (``--pass-device-specs``); None: off.
        self.device_nodes = device_nodes
        #: How the answer names the GPUs to the runtime (``--device-list-strategy``, features).
        self.device_lists = device_lists or DeviceLists()
        #: The CDI spec directories checked before a CDI device is named (None: no CDI strategy).
        self.cdi_specs = cdi_specs
        if self.device_lists.any_cdi and cdi_specs is None:
            raise ValueError("a CDI device list strategy needs the CDI spec directories")
        #: Told each scan of the spec directories (the GPUs' CDI health follows it).
        self.on_cdi_scan = on_cdi_scan
        #: Told ``(namespace/name, replica IDs)`` after each committed Allocate (the replicas the
        #: pod holds from now on: :class:`~hamid.plugin.replica_room.ReplicaRoom`).
        self.on_allocated = on_allocated
        # Without GetPreferredAllocation kubelet's replica pick is arbitrary, so a differing pick is
        # expected (info); with it, a difference means the preference was not honoured (warning).
        self._log_differing_pick = log.warning if preferred_allocation else log.info
        self.pods = pods
        self.node_name = pods.node_name
        self.resource_name = resource_name
        self.inventory = inventory
        self.hami = hami
        self.mismatch_handler = mismatch_handler
        self.call_timeout = call_timeout
        self.prepare_timeout = prepare_timeout
        self._lock = asyncio.Lock()
        self._fallbacks = EntryMemory()
        #: The entries refits replaced, served though the status record may not name them yet
        #: (a refit's record is written off its path).
        self._refits = EntryMemory()
        #: UIDs of the pods this plugin served whole, newest last (bounded): not strangers while
        #: kubelet has yet to write their statuses.
        self._served: OrderedDict[str, None] = OrderedDict()
        #: Refused Allocate calls by :attr:`AllocationError.code` (for metrics and tests).
        self.refusals: Counter[str] = Counter()

    @property
    def deadline_s(self) -> float:
        """Upper bound of one call: the prepare budget plus every API call that may follow it."""
        calls = CALLS_AFTER_PREPARE * max(self.call_timeout, self.pods.call_timeout)
        return self.prepare_timeout + calls + RetryBudget(TRANSIENT_RETRIES).worst_wait_s

    # -- identify the pod ----------------------------------------------------------------------

    async def _identify(self, requested: Sequence[str] | None) -> JSON:
        """The pending pod kubelet is admitting (node lock owner first), or AllocationError.

        Reads the watch caches; only before refusing (no candidate, ambiguous, a pod that bypassed
        hamid, cache not synced) it reads the node and the node's pods once from the API server, in
        case the watches lag behind kubelet. API errors become an AllocationError that marks nothing.
        """
        try:
            try:
                return await self._identify_cached(requested)
            except AllocationError as exc:
                log.info(
                    "pending_pod_not_cached_reading_once",
                    node=self.node_name,
                    reason=str(exc),
                )
            node, pods = await self.pods.fetch_all()
            owner = self.pods.lock_owner(node)
            return dict(
                identify_pod(pods, self.node_name, self.resource_name, owner, requested, self._served)
            )
        except KubeError as exc:
            raise AllocationError(f"cannot identify the pending pod: {exc}", code="api-error") from exc

    async def _identify_cached(self, requested: Sequence[str] | None) -> JSON:
        try:
            async with asyncio.timeout(self.call_timeout):
                await self.pods.wait_synced()
        except TimeoutError as exc:
            raise AllocationError(
                f"the pod cache of node {self.node_name} is not synced yet", code="cache-not-synced"
            ) from exc
        pods = self.pods.pods()
        owner = self.pods.lock_owner()
        if owner is not None and not any(
            objects.namespaced_key(p) == owner
            and is_allocation_candidate(p, self.node_name)
            and has_pending_entry(p)
            for p in pods
        ):
            namespace, _, name = owner.partition("/")
            fetched = await self.pods.fetch_pod(namespace, name)
            if fetched is not None:
                pods = [p for p in pods if objects.namespaced_key(p) != owner] + [fetched]
        return dict(identify_pod(pods, self.node_name, self.resource_name, owner, requested, self._served))

    # -- the NUMA mismatch seam (both doors) -------------------------------------------------

    def _mismatch(
        self,
        door: Door,
        pod: JSON,
        entry: PendingEntry,
        missing: Sequence[str],
        candidates: Sequence[str],
    ) -> NumaMismatch:
        container = container_at(pod, entry.index) or {}
        return NumaMismatch(
            door=door,
            pod=pod,
            node_name=self.node_name,
            container_index=entry.index,
            container_name=str(container.get("name", "")),
            annotated=entry.devices,
            missing=tuple(missing),
            allowed_uuids=allowed_uuids(candidates, self.inventory.uuid_of),
        )

    async def _reread(self, pod: JSON) -> JSON | None:
        """GET the pod after a committed refit (the watch may lag); None when it cannot be read."""
        meta = pod["metadata"]
        try:
            fresh = await self.pods.fetch_pod(meta["namespace"], meta["name"])
            return fresh if fresh is not None and _same_pod(fresh, pod) else None
        except KubeError as exc:
            log.warning(
                "pod_reread_after_refit_failed",
                fallback="resourceVersion guard",
                error=str(exc),
            )
            return None

    async def _mismatch_policy_at_allocate(self, pod: JSON, requests: Sequence[Sequence[str]]) -> JSON:
        """Allocate's door of the mismatch seam: run the policy for each container whose replicas kubelet
        put on other GPUs (unless it already fell back); after a refit, the re-read pod.

        A replacement that is not exactly kubelet's GPUs fails the allocation in every mode.
        """
        if self.inventory.is_mig:
            return pod
        refitted = False
        for entry, ids in zip(pending_entries(to_allocate(pod)), requests, strict=False):
            kubelet = [self.inventory.uuid_of(i) for i in ids]
            gpus = [u for u in kubelet if u is not None]
            if len(gpus) != len(kubelet):
                continue  # unknown IDs: the plan refuses them
            if not kubelet_differs(entry, gpus) or self._fallbacks.holds(pod, entry):
                continue
            missing = list((Counter(d.uuid for d in entry.devices) - Counter(gpus)).elements())
            replacement = await self.mismatch_handler(self._mismatch(Door.ALLOCATE, pod, entry, missing, ids))
            if replacement is None:
                self._fallbacks.remember(pod, entry.index, entry.devices)
                continue
            self._refits.remember(pod, entry.index, replacement)
            if Counter(d.uuid for d in replacement) != Counter(gpus):
                raise AllocationError(
                    "numa refit committed but kubelet cannot honor the selection: "
                    f"{[d.uuid for d in replacement]} are not the GPUs of kubelet's replicas {list(ids)}",
                    code="refit-not-honoured",
                )
            refitted = True
        if not refitted:
            return pod
        fresh = await self._reread(pod)
        if fresh is None or not is_allocation_candidate(fresh, self.node_name):
            raise AllocationError(
                f"pod {objects.namespaced_key(pod)} was refitted but cannot be re-read as pending",
                code="pod-changed",
            )
        return fresh

    # -- GetPreferredAllocation --------------------------------------------------------------

    async def preferred(self, requests: Sequence[PreferredRequest]) -> list[list[str]]:
        """One list of replica IDs per request; an empty list means "no opinion"."""
        async with self._lock:
            try:
                async with asyncio.timeout(self.prepare_timeout):
                    pod = await self._identify(None)
                entries = pending_entries(to_allocate(pod))
            except TimeoutError:
                log.info(
                    "no_preferred_allocation",
                    node=self.node_name,
                    reason=f"cannot identify the pending pod within {self.prepare_timeout:g}s",
                )
                return [[] for _ in requests]
            except (AllocationError, InvalidInput) as exc:
                log.info("no_preferred_allocation", node=self.node_name, reason=str(exc))
                return [[] for _ in requests]
            with structlog.contextvars.bound_contextvars(
                pod=objects.namespaced_key(pod), node=self.node_name
            ):
                out: list[list[str]] = []
                for i, request in enumerate(requests):
                    out.append(
                        await self._preferred_one(pod, entries[i] if i < len(entries) else None, request)
                    )
                return out

    async def _preferred_one(
        self, pod: JSON, entry: PendingEntry | None, request: PreferredRequest
    ) -> list[str]:
        if entry is None:
            return []
        uuid_of = self.inventory.uuid_of
        answer, missing = preferred_answer(
            entry.devices, request.available, request.must_include, request.size, uuid_of
        )
        if missing:
            if self.inventory.is_mig:
                return []
            mismatch = self._mismatch(Door.PREFERRED, pod, entry, missing, request.available)
            try:
                replacement = await self.mismatch_handler(mismatch)
            except AllocationError as exc:
                await complete(self._fail(pod, str(exc)))
                raise
            if replacement is None:
                self._fallbacks.remember(pod, entry.index, entry.devices)
                return self._fallback(entry.index, self._offered(entry, request), request)
            self._refits.remember(pod, entry.index, replacement)
            await self._reread(pod)
            answer, still = preferred_answer(
                replacement, request.available, request.must_include, request.size, uuid_of
            )
            if still or not answer:
                message = (
                    "numa refit committed but kubelet cannot honor the selection: "
                    f"{[d.uuid for d in replacement]} not among the available devices"
                )
                await complete(self._fail(pod, message))
                raise AllocationError(message, code="refit-not-honoured")
        if not answer:
            log.info(
                "annotation_short_of_request_no_preference",
                container_index=entry.index,
                annotated=len(entry.devices),
                size=request.size,
            )
        return answer

    def _offered(self, entry: PendingEntry, request: PreferredRequest) -> list[str]:
        """Must-include replicas plus a replica of each annotated GPU that is still offered."""
        return select_preferred(
            entry.devices, request.available, request.must_include, request.size, self.inventory.uuid_of
        )[0]

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
            "annotated_gpus_not_offered",
            distinct_gpu_preference=bool(chosen),
            container_index=index,
            preferred=chosen,
            size=request.size,
            allocate_serves="annotation",
        )
        return chosen

    # -- Allocate -------------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        """Serve one Allocate call (one answer per request) or raise AllocationError.

        Everything before the commit runs within ``prepare_timeout``; a failure of an identified pod
        (including that deadline) marks it ``bind-phase=failed`` and releases its node lock. Once
        the consume patch is sent, it and the lock release complete even if the call is cancelled.
        An unproven identity marks nothing. Finishes within :attr:`deadline_s`. Every refusal is
        counted in :attr:`refusals` and logged with its code.
        """
        try:
            return await self._allocate(requests)
        except AllocationError as exc:
            self.refusals[exc.code] += 1
            log.warning("allocate_refused", node=self.node_name, code=exc.code, reason=str(exc))
            raise

    async def _allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        if not requests:
            raise AllocationError("Allocate called without container requests", code="empty-request")
        if self.inventory.is_mig and self.mig is None:
            raise AllocationError(
                f"node {self.node_name} is in mig operating mode but its plugin has no NVML to create "
                "MIG instances with (it reads a --devices-file)",
                code="mig-unsupported",
            )
        async with self._lock:
            deadline = asyncio.get_running_loop().time() + self.prepare_timeout
            first = [self.inventory.uuid_of(i) for i in requests[0]]
            known = None if None in first else [u for u in first if u is not None]
            try:
                async with asyncio.timeout_at(deadline):
                    pod = await self._identify(known)
            except TimeoutError as exc:
                raise AllocationError(
                    f"cannot identify the pending pod within {self.prepare_timeout:g}s "
                    "(API server or pod cache too slow)",
                    code="deadline",
                ) from exc
            with structlog.contextvars.bound_contextvars(
                pod=objects.namespaced_key(pod), node=self.node_name
            ):
                try:
                    return await self._allocate_for(pod, requests, deadline)
                except AllocationError as exc:
                    await complete(self._fail(pod, str(exc)))
                    raise
                except InvalidInput as exc:
                    await complete(self._fail(pod, str(exc)))
                    raise AllocationError(str(exc), code="invalid-annotation") from exc
                except KubeError as exc:
                    message = f"API server call failed while allocating: {exc}"
                    await complete(self._fail(pod, message))
                    raise AllocationError(message, code="api-error") from exc
                finally:  # committed, undone, or left to the manager's reconcile
                    self._mig_created.clear()

    def _plan(
        self, pod: JSON, requests: Sequence[Sequence[str]]
    ) -> tuple[list[tuple[int, ContainerDevices]], PodDevices]:
        unknown = sorted({i for r in requests for i in r if self.inventory.uuid_of(i) is None})
        if unknown:
            raise AllocationError(
                f"unknown device IDs {summarize(unknown)}: not replicas of GPUs advertised on node "
                f"{self.node_name}",
                code="unknown-device-id",
            )
        devices = to_allocate(pod)
        booked = booked_entries(pod)
        plans: list[tuple[int, ContainerDevices]] = []
        for ids in requests:
            entries = pending_entries(devices)
            if not entries:
                raise AllocationError(
                    f"pod {objects.namespaced_key(pod)} has no GPU allocation left for this container",
                    code="no-entry-left",
                )
            entry = entries[0]
            if not self._refits.holds(pod, entry):
                refuse_unbooked(entry, booked)
            refuse_unservable(entry, self.node_name, self.inventory.facts)
            requested = [u for u in (self.inventory.uuid_of(i) for i in ids) if u is not None]
            if kubelet_differs(entry, requested):
                self._log_differing_pick(
                    "kubelet_pick_differs_from_annotation",
                    reason="kubelet's replicas are on other GPUs than the allocation annotation; the runtime "
                    "follows the scheduler's accounting (the annotated GPUs), NUMA alignment was not "
                    "achieved for best-effort pods",
                    container_index=entry.index,
                    annotated=[d.uuid for d in entry.devices],
                    kubelet=requested,
                    kubelet_ids=list(ids),
                    numa_alignment=objects.annotations(pod).get(NUMA_ALIGNMENT, ""),
                )
            plans.append((entry.index, entry.devices))
            devices = consume(devices, entry.index)
        return plans, devices

    async def _prepare(self, pod: JSON, requests: Sequence[Sequence[str]]) -> Prepared:
        """Plan, host directories, device nodes and answers (all before the commit; one thread hop
        for the host); on a MIG node, the instances instead (:meth:`_prepare_mig`)."""
        plans, remaining = self._plan(pod, requests)
        if self.mig is not None:
            answers, notes = await self._prepare_mig(pod, plans, self.mig)
            return Prepared(plans, remaining, answers, notes)
        uid = objects.uid(pod)
        containers = [container_at(pod, idx) for idx, _ in plans]
        hook = self.hami.hook_path
        dirs = [hamicore.container_cache_dir(hook, uid, str((c or {}).get("name", ""))) for c in containers]
        nodes = self.device_nodes
        # the booked GPUs of each container, never the GPUs kubelet's replicas sit on
        uuids = [list(dict.fromkeys(d.uuid for d in devs)) for _idx, devs in plans]
        gpus: list[dict[str, str]] = []  # per container, its GPUs' device nodes
        wanted: list[str] = []
        if nodes is not None:
            gpus = [gpu_nodes(each, self.inventory.minor_of) for each in uuids]
            wanted = [*CONTROL_NODES, *(n for each in gpus for n in each.values())]
        try:
            host = await asyncio.to_thread(
                _prepare_host, dirs, hamicore.license_host_path(hook), nodes, wanted, self.cdi_specs
            )
        except OSError as exc:
            raise AllocationError(f"cannot create HAMi-core directories {dirs}: {exc}") from exc
        except Exception as exc:  # refused like any failure: the pod marked failed, the lock released
            raise AllocationError(f"preparing the node for the containers failed: {exc!r}") from exc
        lists = self.device_lists
        if host.cdi is not None:
            if self.on_cdi_scan is not None:
                self.on_cdi_scan(host.cdi)
            for each in uuids:
                host.cdi.require(lists.cdi_names(each))
        answers = [
            lists.answer(each, str(uuidlib.uuid4())).before(
                hami_core_answer(devs, uid, container, self.hami, uuidlib.uuid4().hex, licensed=host.licensed)
            )
            for each, (_idx, devs), container in zip(uuids, plans, containers, strict=True)
        ]
        if nodes is not None:
            answers = [
                dataclasses.replace(answer, devices=nodes.specs(each, host.present))
                for answer, each in zip(answers, gpus, strict=True)
            ]
        return Prepared(plans, remaining, answers)

    async def _prepare_booked(
        self, pod: JSON, requests: Sequence[Sequence[str]], deadline: float
    ) -> tuple[JSON, Prepared]:
        """:meth:`_prepare`; an entry the status record does not name yet is read again until it
        does, for up to :data:`BOOKED_RECORD_WAIT_S` within ``deadline`` (then refused): a refit
        that landed while its answer was lost writes its record a moment later, off its path."""
        loop = asyncio.get_running_loop()
        until = min(deadline, loop.time() + BOOKED_RECORD_WAIT_S)
        delay = BOOKED_RECORD_POLL_S
        while True:
            try:
                return pod, await self._prepare(pod, requests)
            except AllocationError as exc:
                if exc.code != "unbooked-allocation" or loop.time() + delay > until:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                fresh = await self.pods.fetch_pod(objects.namespace(pod), objects.name(pod))
                if (
                    fresh is None
                    or not _same_pod(fresh, pod)
                    or not is_allocation_candidate(fresh, self.node_name)
                ):
                    raise
                pod = fresh

    async def _allocate_for(
        self, pod: JSON, requests: Sequence[Sequence[str]], deadline: float
    ) -> list[ContainerAnswer]:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        budget = RetryBudget(TRANSIENT_RETRIES)
        for _attempt in range(CONFLICT_RETRIES):
            try:
                async with asyncio.timeout_at(deadline):
                    pod = await self._mismatch_policy_at_allocate(pod, requests)
                    pod, prepared = await self._prepare_booked(pod, requests, deadline)
            except TimeoutError as exc:
                raise AllocationError(
                    f"Allocate did not finish preparing within {self.prepare_timeout:g}s "
                    "(nothing was committed)"
                ) from exc
            patch: dict[str, str | None] = {
                DEVICES_TO_ALLOCATE: encode_pod_devices(prepared.remaining),
                **prepared.notes,
            }
            done = not pending_entries(prepared.remaining)
            if done:
                patch[BIND_PHASE] = BIND_PHASE_SUCCESS
            held = [i for ids in requests for i in ids]
            if await complete(self._commit(pod, patch, prepared.plans, budget, held, release=done)):
                return prepared.answers
            try:
                async with asyncio.timeout_at(deadline):
                    fresh = await self.pods.fetch_pod(namespace, name)
            except TimeoutError as exc:
                raise AllocationError(
                    f"pod {namespace}/{name} changed while allocating and could not be re-read within "
                    f"{self.prepare_timeout:g}s"
                ) from exc
            if (
                fresh is None
                or not _same_pod(fresh, pod)
                or not is_allocation_candidate(fresh, self.node_name)
            ):
                raise AllocationError(
                    f"pod {namespace}/{name} changed while allocating and is no longer pending "
                    "(or was replaced by a new pod of that name)"
                )
            pod = fresh
        raise AllocationError(
            f"pod {namespace}/{name} kept changing while allocating ({CONFLICT_RETRIES} conflicts)"
        )

    async def _commit(
        self,
        pod: JSON,
        patch: Mapping[str, str | None],
        plans: Sequence[tuple[int, ContainerDevices]],
        budget: RetryBudget,
        held: list[str],
        *,
        release: bool,
    ) -> bool:
        """The consume patch (resourceVersion-guarded) and, when the pod is done, the lock release;
        once written, :attr:`on_allocated` is told the replicas ``held`` (in the same unit, which
        completes even when the call is cancelled: the hidden replicas rest on it).

        Both are sent at once (one round trip instead of two, docs/reliability.md §3): the pod was
        proven by the lock before, the calls are serialised, and a conflict's retry re-reads the
        same pod. A transient failure (429, 5xx, timeout) is retried with backoff while ``budget``
        lasts, a patch that landed despite its error counting as done. False when the patch
        conflicted (nothing written). Run through :func:`complete`.
        """
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        version = meta.get("resourceVersion")
        releasing = asyncio.ensure_future(self._release_lock(pod)) if release else None

        def write() -> Awaitable[JSON]:
            return self.client.patch_pod_metadata(
                namespace, name, annotations=dict(patch), resource_version=version, timeout=self.call_timeout
            )

        async def landed() -> JSON | None:
            current = await self.pods.fetch_pod(namespace, name)
            if current is None or objects.resource_version(current) == version:
                return None
            annotations = objects.annotations(current)
            return current if all(annotations.get(k) == v for k, v in patch.items()) else None

        try:
            try:
                patched = await write_retrying(write, landed, budget, f"pod {namespace}/{name} allocation")
            except Conflict:
                # a retry refused because an earlier attempt, its answer and read-backs lost, landed:
                # that is this write done, not a change to plan again (the next entry was served)
                found = await _quietly(landed())
                if found is None:
                    return False
                patched = found
        finally:
            if releasing is not None:
                await releasing
        self.pods.remember(patched)
        for idx, devs in plans:
            self._fallbacks.forget(pod, idx)
            self._refits.forget(pod, idx)
            log.info(
                "allocated",
                container_index=idx,
                devices=[d.uuid for d in devs],
                memory=[d.usedmem for d in devs],
                cores=devs[0].usedcores,
            )
        if self.on_allocated is not None:
            self.on_allocated(f"{namespace}/{name}", held)
        if release:  # served whole
            self._served[objects.uid(pod)] = None
            while len(self._served) > FALLBACK_MEMORY:
                self._served.popitem(last=False)
        return True

    # -- failure and the node lock -----------------------------------------------------------------

    async def _fail(self, pod: JSON, reason: str) -> None:
        """Mark the pod ``bind-phase=failed`` and release the node lock if it holds it (best effort,
        both at once); destroy the MIG instances this Allocate created."""
        log.error("allocation_failed", reason=reason)
        await asyncio.gather(self._mark_failed(pod), self._release_lock(pod), self._undo_mig())

    async def _undo_mig(self) -> None:
        """Destroy the MIG instances the failed Allocate created (a failure is logged by the manager
        and left to its reconcile)."""
        created, self._mig_created = self._mig_created, []
        if self.mig is not None:
            for key in reversed(created):
                await self.mig.release(key)

    # -- MIG ----------------------------------------------------------------------------------------

    def _mig_reservations(
        self, pod: JSON, plans: Sequence[tuple[int, ContainerDevices]]
    ) -> tuple[MigAllocation, ...]:
        """The pod's reservations: those its status record books (``unbooked-allocation`` otherwise;
        the annotation alone where the pod has no record, as HAMi's scheduler writes none), each
        container served checked against its entry and this node's registered capability
        (``mig-reservation-missing`` / ``mig-reservation-invalid``)."""
        value = objects.annotations(pod).get(MIG_ALLOCATIONS, "")
        try:
            records = decode_mig_allocations(value)
        except InvalidInput as exc:
            raise AllocationError(
                f"the MIG reservation of pod {objects.namespaced_key(pod)} cannot be read: {exc}",
                code="mig-reservation-invalid",
            ) from exc
        refuse_unbooked_mig(pod, records)
        for index, devices in plans:
            mine = _of_container(records, index)
            if not mine:
                raise AllocationError(
                    f"pod {objects.namespaced_key(pod)} has no MIG reservation ({MIG_ALLOCATIONS}) for "
                    f"container {index}; a MIG node serves only pods its scheduler reserved MIG "
                    "instances for",
                    code="mig-reservation-missing",
                )
            if len(mine) != len(devices):
                raise AllocationError(
                    f"container {index} has {len(mine)} MIG reservations for {len(devices)} devices",
                    code="mig-reservation-invalid",
                )
            for record, device in zip(mine, devices, strict=True):
                self._check_reservation(index, record, device.uuid)
        return records

    def _check_reservation(self, index: int, record: MigAllocation, uuid: str) -> None:
        """A reservation must name the entry's GPU, and a profile and placement the GPU registered."""
        where = f"MIG reservation of container {index} device {record.device_index}"
        if record.gpu_uuid != uuid:
            raise AllocationError(
                f"{where} names GPU {record.gpu_uuid}, but the container's allocation names {uuid}",
                code="mig-reservation-invalid",
            )
        profile = self.inventory.mig_profile(uuid, record.profile)
        if profile is None:
            raise AllocationError(
                f"{where}: profile {record.profile!r} is not registered for GPU {uuid} on node "
                f"{self.node_name}",
                code="mig-reservation-invalid",
            )
        if record.placement not in profile.placements:
            raise AllocationError(
                f"{where}: placement start {record.placement.start} size {record.placement.size} is not "
                f"one of profile {record.profile}'s on GPU {uuid} "
                f"({[(p.start, p.size) for p in profile.placements]})",
                code="mig-reservation-invalid",
            )

    async def _prepare_mig(
        self, pod: JSON, plans: Sequence[tuple[int, ContainerDevices]], mig: MigManager
    ) -> tuple[list[ContainerAnswer], dict[str, str]]:
        """Realize each served container's reservations; answer their MIG UUIDs (no HAMi-core part:
        MIG isolates in hardware), and the annotation with the runtime ids added."""
        records = self._mig_reservations(pod, plans)
        per_container: list[list[MigAllocation]] = []
        for index, _devices in plans:
            each = []
            for record in _of_container(records, index):
                live, created = await mig.ensure(record, owner_of(pod))
                if created:
                    self._mig_created.append(record.reservation_key)
                each.append(
                    dataclasses.replace(
                        record,
                        mig_uuid=live.mig_uuid,
                        gpu_instance_id=live.gpu_instance_id,
                        compute_instance_id=live.compute_instance_id,
                    )
                )
            per_container.append(each)
        realized = {(r.container_index, r.device_index): r for each in per_container for r in each}
        answers = []
        for each in per_container:
            part = self.device_lists.answer([r.mig_uuid for r in each], str(uuidlib.uuid4()))
            answers.append(
                ContainerAnswer(
                    envs=part.envs,
                    mounts=part.mounts,
                    cache_dir="",
                    annotations=part.annotations,
                    cdi_devices=part.cdi_devices,
                )
            )
        if self.device_nodes is not None:
            answers = await self._mig_device_specs(answers, per_container, self.device_nodes)
        merged = tuple(realized.get((r.container_index, r.device_index), r) for r in records)
        return answers, {MIG_ALLOCATIONS: encode_mig_allocations(merged)}

    async def _mig_device_specs(
        self, answers: list[ContainerAnswer], per_container: list[list[MigAllocation]], nodes: DeviceNodes
    ) -> list[ContainerAnswer]:
        """Each answer with the DeviceSpecs of its MIG devices: control nodes, the parent GPU, the
        GPU and compute instance capability nodes (as NVIDIA's plugin declares a MIG device)."""
        wanted: list[dict[str, str]] = []
        try:
            minors = parse_mig_minors(await asyncio.to_thread(read_text, self.mig_minors, MIG_MINORS_LIMIT))
        except (OSError, InvalidInput) as exc:
            raise AllocationError(
                f"--pass-device-specs: cannot read the MIG capability minors ({exc})",
                code="device-node-missing",
            ) from exc
        for each in per_container:
            nodes_of: dict[str, str] = {}
            for r in each:
                assert r.gpu_instance_id is not None and r.compute_instance_id is not None
                instance = (r.gpu_instance_id, r.compute_instance_id)
                nodes_of |= mig_nodes(minors, r.gpu_uuid, self.inventory.minor_of, r.mig_uuid, instance)
            wanted.append(nodes_of)
        present = await asyncio.to_thread(
            nodes.present, [*CONTROL_NODES, *(n for each in wanted for n in each.values())]
        )
        return [
            dataclasses.replace(answer, devices=nodes.specs(each, present))
            for answer, each in zip(answers, wanted, strict=True)
        ]

    async def _mark_failed(self, pod: JSON) -> None:
        try:
            patched = await self.client.patch_pod_metadata(
                objects.namespace(pod),
                objects.name(pod),
                annotations={BIND_PHASE: BIND_PHASE_FAILED},
                uid=objects.uid(pod) or None,  # never a new pod of the same name
                timeout=self.call_timeout,
            )
            self.pods.remember(patched)
        except KubeError as exc:
            log.error("bind_phase_failed_not_marked", error=str(exc))

    async def _release_lock(self, pod: JSON) -> None:
        """Remove the node lock only if ``pod`` holds it (resourceVersion-guarded, one retry).

        The lock names a pod, not its UID: a new pod of the same name (force-deleted and created
        again) that the pod cache already shows keeps it. The cached node first (no GET when the
        cache is current); a conflict re-reads it.
        """
        owner = objects.namespaced_key(pod)
        cached = self.pods.pod(owner)
        if cached is not None and not _same_pod(cached, pod):
            log.info("node_lock_kept", owner=owner, why="a new pod of that name holds it")
            return
        for attempt in range(2):
            node: NodeBody | None = self.pods.node() if attempt == 0 else None
            try:
                if node is None or self.pods.lock_owner(node) != owner:  # absent, stale or lagging
                    node = await self.pods.fetch_node()
                if self.pods.lock_owner(node) != owner:
                    return
                await self.client.patch_node_metadata(
                    self.node_name,
                    annotations=nodelock.release_annotations(),
                    resource_version=objects.resource_version(node),
                    timeout=self.call_timeout,
                )
                log.info("node_lock_released", owner=owner)
                return
            except Conflict:
                continue
            except KubeError as exc:
                log.error("node_lock_release_failed", owner=owner, error=str(exc))
                return
        log.error("node_lock_release_failed", cause="node kept changing", owner=owner)


def _same_pod(fresh: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``fresh`` (read by name) is still ``pod``, not a new pod of the same name."""
    return not objects.uid(pod) or objects.uid(fresh) == objects.uid(pod)


async def _quietly(read: Awaitable[JSON | None]) -> JSON | None:
    """A read-back's answer, None when it fails too."""
    try:
        return await read
    except KubeError:
        return None

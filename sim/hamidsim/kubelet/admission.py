"""Pod admission as kubelet runs it: the Topology Manager's admit handler in container or pod scope
(hints from the device and CPU managers → merge → allocate, ``scope_container.go`` /
``scope_pod.go``), then the predicate handler's allocatable check (``lifecycle/predicate.go``:
``OutOfpods``, ``OutOfcpu``, ``OutOfmemory``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import structlog

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.assignment import ContainerAssignment, PodAdmission
from hamidsim.kubelet.cpu_assignment import CpuAllocationError
from hamidsim.kubelet.cpumanager import CpuManager, SMTAlignmentError
from hamidsim.kubelet.devicemanager import DeviceManager
from hamidsim.kubelet.errors import (
    REASON_UNEXPECTED_ADMISSION,
    AdmissionFailure,
    topology_affinity_error,
    unexpected,
)
from hamidsim.kubelet.memorymanager import MemoryManagerError, StaticMemoryPolicy
from hamidsim.kubelet.podutil import is_restartable_init, pod_aggregate, pod_containers
from hamidsim.kubelet.topologymanager import (
    POLICY_NONE,
    SCOPE_POD,
    Distance,
    ProviderHints,
    TopologyHint,
    merge_hints,
)


@dataclass(frozen=True, slots=True)
class TopologySettings:
    """The Topology Manager as configured: policy, scope, NUMA nodes and (prefer-closest) distances."""

    policy: str
    scope: str
    numa_ids: tuple[int, ...]
    distance: Distance | None = None


class Admitter:
    """Runs the Topology Manager's admission for one pod against the device and CPU managers."""

    def __init__(
        self,
        settings: TopologySettings,
        devices: DeviceManager,
        cpus: CpuManager,
        log: Any,
        memory: StaticMemoryPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.devices = devices
        self.cpus = cpus
        #: The Static memory manager (None with policy None, which gives no hints and pins nothing).
        self.memory = memory
        self._log = log

    def _merge(self, providers: list[ProviderHints]) -> TopologyHint:
        s = self.settings
        hint, admit = merge_hints(s.policy, s.numa_ids, providers, s.distance)
        self._log.info("best_topology_hint", hint=hint.describe(), admit=admit)
        if not admit:
            raise topology_affinity_error()
        return hint

    def container_hint(
        self, pod: Mapping[str, Any], container: Mapping[str, Any]
    ) -> tuple[TopologyHint, bool]:
        """The Topology Manager's merged hint for one container of a pod not yet admitted, and
        whether it would admit it (container scope), allocating nothing: a dry run for a judge
        that asks where kubelet would put a pod on this node now."""
        s = self.settings
        providers = self._container_providers(pod, "", container, {}, set())
        return merge_hints(s.policy, s.numa_ids, providers, s.distance)

    async def admit(self, pod: Mapping[str, Any], record: PodAdmission) -> None:
        """Allocate every container or raise :class:`AdmissionFailure` (the caller releases on failure)."""
        pod_hint: TopologyHint | None = None
        if self.settings.scope == SCOPE_POD and self.settings.policy != POLICY_NONE:
            pod_hint = self._merge(self._pod_providers(pod, record.uid))
        reuse_devices: dict[str, set[str]] = {}
        reuse_cpus: set[int] = set()
        for index, (container, is_init) in enumerate(pod_containers(pod)):
            name = str(container.get("name") or "")
            with structlog.contextvars.bound_contextvars(container=name):
                hint = pod_hint
                if self.settings.scope != SCOPE_POD and self.settings.policy != POLICY_NONE:
                    hint = self._merge(
                        self._container_providers(pod, record.uid, container, reuse_devices, reuse_cpus)
                    )
                restartable = is_init and is_restartable_init(container)
                assignment = ContainerAssignment(
                    name=name, index=index, init=is_init, hint=hint, restartable=restartable
                )
                record.containers.append(assignment)
                releases = is_init and not restartable
                await self._allocate(
                    pod, record.uid, container, assignment, reuse_devices, reuse_cpus, releases
                )
        self._record_memory(record)

    def _record_memory(self, record: PodAdmission) -> None:
        """Each container's memory blocks as the pod holds them after every container is admitted
        (earlier init containers' blocks shrink by what later containers reused)."""
        if self.memory is None:
            return
        held = self.memory.assignments.get(record.uid, {})
        for assignment in record.containers:
            blocks = held.get(assignment.name, [])
            assignment.memory = {b.resource: (b.numa, b.size) for b in blocks}

    def _container_providers(
        self,
        pod: Mapping[str, Any],
        uid: str,
        container: Mapping[str, Any],
        reuse_devices: dict[str, set[str]],
        reuse_cpus: set[int],
    ) -> list[ProviderHints]:
        name = str(container.get("name") or "")
        held = self.devices.pod_devices.get(uid, {}).get(name, {})
        device_hints = self.devices.hints(
            self.settings.numa_ids, self.devices.container_requests(container), reuse_devices, held
        )
        ncpus = self.cpus.requested(pod, container)
        cpu_hints = None
        if ncpus:
            cpu_hints = {
                "cpu": self.cpus.hints(ncpus, reuse_cpus, self.cpus.assignments.get(uid, {}).get(name))
            }
        memory_hints = None if self.memory is None else self._memory_hints(pod, uid, container)
        return [device_hints or None, cpu_hints, memory_hints]

    def _memory_hints(
        self, pod: Mapping[str, Any], uid: str, container: Mapping[str, Any] | None
    ) -> ProviderHints:
        """The memory manager's hints; an unreadable request gives none (kubelet logs it and goes on)."""
        assert self.memory is not None
        try:
            if container is None:
                return self.memory.pod_hints(pod, uid)
            return self.memory.container_hints(pod, uid, container)
        except MemoryManagerError:
            return None

    def _pod_providers(self, pod: Mapping[str, Any], uid: str) -> list[ProviderHints]:
        """``GetPodTopologyHints`` of both providers: one hint set for the pod's accumulated request."""
        device_hints = self.devices.hints(
            self.settings.numa_ids, self.devices.pod_requests(pod), {}, self.devices.pod_allocated(uid)
        )
        cpu_hints = self.cpus.pod_hints(pod, uid)
        memory_hints = None if self.memory is None else self._memory_hints(pod, uid, None)
        return [device_hints or None, None if cpu_hints is None else {"cpu": cpu_hints}, memory_hints]

    async def _allocate(
        self,
        pod: Mapping[str, Any],
        uid: str,
        container: Mapping[str, Any],
        assignment: ContainerAssignment,
        reuse_devices: dict[str, set[str]],
        reuse_cpus: set[int],
        releases: bool,
    ) -> None:
        """``allocateAlignedResources``: devices, then CPUs, then memory (kubelet's provider order)."""
        affinity = None if assignment.hint is None else assignment.hint.affinity
        requests = self.devices.container_requests(container)
        await self.devices.allocate_container(uid, assignment, requests, reuse_devices, affinity, releases)
        self._allocate_cpus(pod, uid, container, assignment, reuse_cpus, releases)
        if self.memory is not None:
            try:
                self.memory.allocate(pod, uid, container, assignment.hint or TopologyHint(None, False))
            except MemoryManagerError as exc:
                raise unexpected(str(exc)) from exc

    def _allocate_cpus(
        self,
        pod: Mapping[str, Any],
        uid: str,
        container: Mapping[str, Any],
        assignment: ContainerAssignment,
        reuse_cpus: set[int],
        releases: bool,
    ) -> None:
        """The static CPU policy's ``Allocate`` inside the hint."""
        affinity = None if assignment.hint is None else assignment.hint.affinity
        ncpus = self.cpus.requested(pod, container)
        if not ncpus:
            return
        try:
            cpus = self.cpus.allocate(uid, assignment.name, ncpus, affinity, frozenset(reuse_cpus))
        except SMTAlignmentError as exc:
            raise AdmissionFailure(exc.reason, exc.message) from exc
        except CpuAllocationError as exc:
            raise unexpected(str(exc)) from exc
        assignment.cpus = cpus
        topo = self.cpus.topology
        assignment.cpu_numa_nodes = tuple(sorted(n for n in topo.numa_nodes if cpus & topo.numa_cpus[n]))
        if releases:
            reuse_cpus |= cpus
        else:
            reuse_cpus -= cpus


async def admit_pod(
    admitter: Admitter,
    pod: Mapping[str, Any],
    record: PodAdmission,
    others: Iterable[Mapping[str, Any]],
    allocatable: tuple[int, int, int],
) -> None:
    """kubelet's admission of one pod: the Topology Manager's handler, then the allocatable predicate.

    ``record.admitted`` tells the outcome (``reason`` and ``message`` when rejected); a rejected
    pod's CPUs and devices go back at once. ``others`` are the node's active pods and
    ``allocatable`` its (milli-CPU, memory bytes, pods).
    """
    try:
        await admitter.admit(pod, record)
        check_allocatable(pod, others, *allocatable)
        record.admitted = True
    except AdmissionFailure as failure:
        record.reason, record.message = failure.reason, failure.message
    except InvalidInput as exc:
        record.reason = REASON_UNEXPECTED_ADMISSION
        record.message = f"Allocate failed due to {exc}, which is unexpected"
    if not record.admitted:
        admitter.devices.release(record.uid)
        admitter.cpus.release(record.uid)
        if admitter.memory is not None:
            admitter.memory.release(record.uid)


# --- predicate admission (lifecycle/predicate.go, noderesources fit) --------------------------------


def _ceil(value: Fraction | int) -> int:
    return -((-value.numerator) // value.denominator)


def check_allocatable(
    pod: Mapping[str, Any],
    others: Iterable[Mapping[str, Any]],
    allocatable_millicpu: int,
    allocatable_memory: int,
    allowed_pods: int,
) -> None:
    """Refuse a pod whose requests do not fit the node's allocatable beside the active pods."""
    active = list(others)
    if len(active) + 1 > allowed_pods:
        raise _insufficient("pods", 1, len(active), allowed_pods)
    cpu, memory = _requested(pod)
    used = [_requested(p) for p in active]
    used_cpu, used_memory = sum(u[0] for u in used), sum(u[1] for u in used)
    if cpu and used_cpu + cpu > allocatable_millicpu:
        raise _insufficient("cpu", cpu, used_cpu, allocatable_millicpu)
    if memory and used_memory + memory > allocatable_memory:
        raise _insufficient("memory", memory, used_memory, allocatable_memory)


def _requested(pod: Mapping[str, Any]) -> tuple[int, int]:
    requests = pod_aggregate(pod, "requests", {"cpu", "memory"})
    return _ceil(requests.get("cpu", 0) * 1000), _ceil(requests.get("memory", 0))


def _insufficient(resource: str, requested: int, used: int, capacity: int) -> AdmissionFailure:
    return AdmissionFailure(
        f"OutOf{resource}",
        f"Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, "
        f"capacity: {capacity}",
    )

"""kubelet's device manager (``pkg/kubelet/cm/devicemanager``): per-resource device state fed by
``ListAndWatch``, capacity, topology hints, device selection (``devicesToAllocate`` with both
``GetPreferredAllocation`` cases), ``Allocate`` and ``PreStartContainer``.

Device topology is ``tuple[int, ...] | None``: ``None`` is an unset ``TopologyInfo``, ``()`` a set
one with no nodes (kubelet treats the two differently for reusable devices).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.model.kube import JSON
from hamidsim.kubelet.assignment import ContainerAssignment, PreferredCall
from hamidsim.kubelet.endpoint import RPC_ERRORS, Endpoint, connect, rpc_error_text
from hamidsim.kubelet.errors import unexpected
from hamidsim.kubelet.podutil import container_limits, pod_aggregate
from hamidsim.kubelet.quantity import quantity_value
from hamidsim.kubelet.topologymanager import NumaMask, TopologyHint, iterate_masks, mask_value

HEALTHY = "Healthy"
#: The fake NUMA node kubelet files devices without topology under (``nodeWithoutTopology``).
NODE_WITHOUT_TOPOLOGY = -1
DeviceTopology = tuple[int, ...] | None


def has_topology_alignment(all_devices: Mapping[str, DeviceTopology]) -> bool:
    """``deviceHasTopologyAlignment``: some device of the resource reports at least one NUMA node."""
    return any(topo for topo in all_devices.values())


def _any_set(mask: NumaMask, topology: DeviceTopology) -> bool:
    return bool(topology) and any(n in mask for n in topology or ())


def _mask_counts(topologies: Iterable[tuple[int, ...]]) -> list[tuple[int, int]]:
    """``(bitmask, devices)`` per distinct topology (devices counted first: one bitmask per topology)."""
    counts: Counter[int] = Counter()
    for topology, devices in Counter(topologies).items():
        counts[mask_value(topology)] += devices
    return list(counts.items())


def generate_device_hints(
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
) -> list[TopologyHint]:
    """``generateDeviceTopologyHints`` for one resource.

    ``all_devices`` is every device of the resource (healthy or not, allocated or not) with its
    topology; ``available`` the free healthy ones; ``reusable`` those released by this pod's init
    containers.
    """
    # Devices grouped by topology (as bitmasks): each mask's counts cost one step per distinct topology.
    all_groups = _mask_counts(topo for topo in all_devices.values() if topo)
    available_groups = _mask_counts(t for d in set(available) if (t := all_devices.get(d)))
    reusable_list = sorted(set(reusable))
    min_affinity_size = len(numa_nodes)
    found: list[NumaMask] = []
    for mask in iterate_masks(numa_nodes):
        bits = mask_value(mask)
        devices_in_mask = sum(n for topo, n in all_groups if topo & bits)
        if devices_in_mask >= request and len(mask) < min_affinity_size:
            min_affinity_size = len(mask)
        matching = 0
        disqualified = False
        for device in reusable_list:
            topo = all_devices.get(device)
            if topo is None:
                continue
            if not _any_set(mask, topo):
                disqualified = True
                break
            matching += 1
        if disqualified:
            continue
        matching += sum(n for topo, n in available_groups if topo & bits)
        if matching >= request:
            found.append(mask)
    return [TopologyHint(mask, len(mask) == min_affinity_size) for mask in found]


def device_hints_for_resource(
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
    already_allocated: Iterable[str] = (),
) -> list[TopologyHint] | None:
    """``GetTopologyHints`` for one requested resource: None = no preference, [] = cannot satisfy."""
    if not has_topology_alignment(all_devices):
        return None
    allocated = set(already_allocated)
    if allocated:
        if len(allocated) != request:
            return []
        return generate_device_hints(numa_nodes, all_devices, allocated, (), request)
    available_set = set(available)
    reusable_set = set(reusable)
    if len(available_set | reusable_set) < request:
        return []
    return generate_device_hints(numa_nodes, all_devices, available_set, reusable_set, request)


# --- device selection helpers (manager.go: filterByAffinity) -------------------------------------


def filter_by_affinity(
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    affinity: NumaMask | None,
) -> tuple[set[str], set[str], set[str]]:
    """``filterByAffinity``: split free devices into (aligned, unaligned, no-affinity) for a hint."""
    available_set = set(available)
    if not has_topology_alignment(all_devices) or affinity is None:
        return set(), set(), available_set
    per_node: dict[int, set[str]] = {}
    for device in available_set:
        topo = all_devices.get(device)
        if not topo:
            per_node.setdefault(NODE_WITHOUT_TOPOLOGY, set()).add(device)
            continue
        for node in topo:
            per_node.setdefault(node, set()).add(device)

    def order(node: int) -> tuple[int, int, int]:
        if node in affinity:
            group = 0
        elif node == NODE_WITHOUT_TOPOLOGY:
            group = 2
        else:
            group = 1
        return (group, len(per_node[node]), node)

    nodes = sorted(per_node, key=order)
    aligned: set[str] = set()
    unaligned: set[str] = set()
    no_affinity: set[str] = set()
    for device in available_set:
        for node in nodes:
            if device in per_node[node]:
                if node == NODE_WITHOUT_TOPOLOGY:
                    no_affinity.add(device)
                elif node in affinity:
                    aligned.add(device)
                else:
                    unaligned.add(device)
                break
    return aligned, unaligned, no_affinity


def allocate_response_json(response: pb.ContainerAllocateResponse) -> JSON:
    """An ``Allocate`` answer for one container, as the assignment annotation records it."""
    return {
        "envs": dict(sorted(response.envs.items())),
        "mounts": [
            {"containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only}
            for m in response.mounts
        ],
        "devices": [
            {"containerPath": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in response.devices
        ],
        "annotations": dict(sorted(response.annotations.items())),
        "cdiDevices": [c.name for c in response.cdi_devices],
    }


@dataclass
class ResourceState:
    """kubelet's per-resource device state (``allDevices``, ``healthyDevices``, ``unhealthyDevices``)."""

    name: str
    all_devices: dict[str, DeviceTopology] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    endpoint: Endpoint | None = None
    stopped_at: float | None = None
    registrations: int = 0
    updates: int = 0

    @property
    def options(self) -> pb.DevicePluginOptions | None:
        """The options from ``GetDevicePluginOptions`` of the current endpoint (None if stopped)."""
        return None if self.endpoint is None else self.endpoint.options

    @property
    def connected(self) -> bool:
        """True while a registered plugin's ListAndWatch stream is live."""
        return self.endpoint is not None and not self.endpoint.stopped


def devices_on_numa(state: ResourceState, numa: int) -> list[str]:
    """IDs of ``state``'s devices reporting NUMA node ``numa`` (sorted)."""
    return sorted(d for d, topo in state.all_devices.items() if topo and numa in topo)


#: pod UID → container → resource → device IDs (kubelet's ``podDevices``, the checkpoint's content).
PodDevices = dict[str, dict[str, dict[str, frozenset[str]]]]


class DeviceManager:
    """Device state of every resource, the endpoints and what each pod's containers hold."""

    def __init__(
        self,
        root: Path,
        *,
        rpc_timeout: float,
        dial_timeout: float,
        endpoint_stop_grace: float,
        on_change: Callable[[], None],
        log: Any,
    ) -> None:
        self.root = root
        self.rpc_timeout = rpc_timeout
        self.dial_timeout = dial_timeout
        self.endpoint_stop_grace = endpoint_stop_grace
        self.resources: dict[str, ResourceState] = {}
        self.pod_devices: PodDevices = {}
        self._on_change = on_change
        self._log = log
        self._tasks: set[asyncio.Task[None]] = set()

    # -- registration and ListAndWatch (plugin/v1beta1 handler.go, client.go) ---------------------

    def plugin_socket(self, endpoint: str) -> str:
        """``filepath.Join(socketDir, endpoint)``: an absolute endpoint still lands inside ``root``."""
        return os.path.normpath(os.path.join(self.root, endpoint.lstrip("/")))

    async def register(self, resource: str, endpoint_name: str) -> None:
        """A validated ``Register``: connect to the plugin, replace any earlier endpoint, watch."""
        bound = self._log.bind(resource=resource, endpoint=endpoint_name)
        socket = self.plugin_socket(endpoint_name)
        endpoint = await connect(resource, socket, self.dial_timeout, self.rpc_timeout)
        state = self.resources.setdefault(resource, ResourceState(resource))
        previous = state.endpoint
        state.endpoint = endpoint
        state.stopped_at = None
        state.registrations += 1
        if previous is not None:
            bound.info("registration_replaces_endpoint", previous=previous.socket)
        task: asyncio.Task[None] = asyncio.ensure_future(self._watch(endpoint))
        task.set_name(f"sim-kubelet-law-{resource}")
        endpoint.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        bound.info(
            "device_plugin_connected",
            pre_start_required=endpoint.options.pre_start_required,
            get_preferred_allocation_available=endpoint.options.get_preferred_allocation_available,
        )
        self._on_change()

    async def _watch(self, endpoint: Endpoint) -> None:
        try:
            error = await endpoint.list_and_watch(self._devices_updated)
            bound = self._log.bind(resource=endpoint.resource, error=error)
            if endpoint.stopped:
                bound.debug("list_and_watch_closed_on_shutdown")
            else:
                bound.warning("list_and_watch_ended_unexpectedly")
        finally:
            self._disconnected(endpoint)

    def _devices_updated(self, endpoint: Endpoint, response: pb.ListAndWatchResponse) -> None:
        state = self.resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint:
            self._log.info("replaced_endpoint_update_ignored", resource=endpoint.resource)
            return
        state.all_devices = {}
        state.healthy = set()
        state.unhealthy = set()
        for device in response.devices:
            topology = tuple(n.ID for n in device.topology.nodes) if device.HasField("topology") else None
            state.all_devices[device.ID] = topology
            (state.healthy if device.health == HEALTHY else state.unhealthy).add(device.ID)
        state.updates += 1
        endpoint.updates += 1
        self._log.info(
            "device_updates_processed",
            resource=endpoint.resource,
            total=len(response.devices),
            healthy=len(state.healthy),
        )
        self._on_change()

    def _disconnected(self, endpoint: Endpoint) -> None:
        endpoint.close()
        state = self.resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint:
            return
        state.unhealthy |= state.healthy
        state.healthy = set()
        state.stopped_at = time.monotonic()
        self._log.info("endpoint_unhealthy_all_devices_unhealthy", resource=endpoint.resource)
        self._on_change()

    async def stop_endpoints(self) -> None:
        """Close every endpoint and wait for its ListAndWatch task."""
        for state in self.resources.values():
            if state.endpoint is not None:
                state.endpoint.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                continue
        self._tasks.clear()

    def forget_devices(self) -> None:
        """After a restart: every known resource has no devices and a stopped endpoint."""
        now = time.monotonic()
        for state in self.resources.values():
            state.all_devices = {}
            state.healthy = set()
            state.unhealthy = set()
            state.endpoint = None
            state.stopped_at = now

    # -- capacity and bookkeeping ----------------------------------------------------------------

    def device_capacity(self) -> tuple[dict[str, int], dict[str, int], set[str]]:
        """kubelet's ``GetCapacity``: (capacity, allocatable, resources dropped after the grace period)."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        deleted: set[str] = set()
        now = time.monotonic()
        for name, state in list(self.resources.items()):
            expired = state.stopped_at is not None and now - state.stopped_at > self.endpoint_stop_grace
            if expired and not state.connected:
                del self.resources[name]
                deleted.add(name)
                continue
            capacity[name] = len(state.healthy) + len(state.unhealthy)
            allocatable[name] = len(state.healthy)
        return capacity, allocatable, deleted

    def allocated_devices(self, resource: str) -> set[str]:
        """Devices of ``resource`` held by live pods on this node (kubelet's ``allocatedDevices``)."""
        result: set[str] = set()
        for containers in self.pod_devices.values():
            for resources in containers.values():
                result |= resources.get(resource, frozenset())
        return result

    def available_devices(self, resource: str) -> set[str]:
        """Healthy devices no pod holds."""
        state = self.resources.get(resource)
        return set() if state is None else state.healthy - self.allocated_devices(resource)

    def _known(self, resource: str) -> bool:
        return resource in self.resources or any(
            resource in r for c in self.pod_devices.values() for r in c.values()
        )

    def container_requests(self, container: Mapping[str, Any]) -> dict[str, int]:
        """``getContainerDeviceRequest``: limits of resources the device manager knows."""
        return {
            resource: quantity_value(value, f"container {container.get('name')!r} limits.{resource}")
            for resource, value in container_limits(container).items()
            if self._known(resource)
        }

    def pod_requests(self, pod: Mapping[str, Any]) -> dict[str, int]:
        """``getPodDeviceRequest``: ``PodLimits`` of the device-plugin resources."""
        limits = pod_aggregate(pod, "limits")
        return {r: -((-q.numerator) // q.denominator) for r, q in limits.items() if self._known(r)}

    def hints(
        self,
        numa_ids: Sequence[int],
        requests: Mapping[str, int],
        reusable: Mapping[str, set[str]],
        allocated: Mapping[str, Iterable[str]],
    ) -> dict[str, list[TopologyHint] | None]:
        """``GetTopologyHints`` / ``GetPodTopologyHints`` for the given requests.

        ``allocated`` are devices this container (or pod) already holds (a re-admission after a restart).
        """
        return {
            resource: device_hints_for_resource(
                numa_ids,
                self.resources[resource].all_devices if resource in self.resources else {},
                self.available_devices(resource),
                reusable.get(resource, set()),
                count,
                allocated.get(resource, ()),
            )
            for resource, count in requests.items()
        }

    def release(self, uid: str) -> bool:
        """Give back everything the pod holds; True if it held anything."""
        return bool(self.pod_devices.pop(uid, None))

    def pod_allocated(self, uid: str) -> dict[str, set[str]]:
        """Devices per resource the pod holds, over all its containers."""
        result: dict[str, set[str]] = {}
        for resources in self.pod_devices.get(uid, {}).values():
            for resource, devices in resources.items():
                result.setdefault(resource, set()).update(devices)
        return result

    def describe(self) -> list[JSON]:
        """Per resource: device counts, registration count and plugin options (for logs and demos)."""
        result = []
        for name in sorted(self.resources):
            state = self.resources[name]
            options = state.options
            result.append(
                {
                    "resource": name,
                    "healthy": len(state.healthy),
                    "unhealthy": len(state.unhealthy),
                    "allocated": len(self.allocated_devices(name)),
                    "registrations": state.registrations,
                    "connected": state.connected,
                    "getPreferredAllocationAvailable": bool(
                        options and options.get_preferred_allocation_available
                    ),
                    "preStartRequired": bool(options and options.pre_start_required),
                }
            )
        return result

    # -- allocation (manager.go) ------------------------------------------------------------------

    async def allocate_container(
        self,
        uid: str,
        assignment: ContainerAssignment,
        requests: Mapping[str, int],
        reusable: dict[str, set[str]],
        affinity: NumaMask | None,
        releases: bool,
    ) -> None:
        """``allocateContainerResources``: select and ``Allocate`` each requested resource.

        ``releases``: the container is a plain init container, whose devices the next ones reuse.
        """
        for resource, count in requests.items():
            held = self.pod_devices.get(uid, {}).get(assignment.name, {}).get(resource)
            if held is not None:
                assignment.devices[resource] = tuple(sorted(held))
                continue
            devices = await self.devices_to_allocate(
                resource, count, reusable.get(resource, set()), affinity, assignment
            )
            if not devices:
                continue
            response = await self._allocate_rpc(resource, devices)
            self.pod_devices.setdefault(uid, {}).setdefault(assignment.name, {})[resource] = frozenset(
                devices
            )
            assignment.devices[resource] = tuple(sorted(devices))
            topo = self.resources[resource].all_devices
            assignment.device_numa_nodes[resource] = tuple(
                sorted({n for d in devices for n in (topo.get(d) or ())})
            )
            assignment.allocate[resource] = allocate_response_json(response)
            if releases:
                reusable.setdefault(resource, set()).update(devices)
            else:
                reusable.setdefault(resource, set()).difference_update(devices)

    async def devices_to_allocate(
        self,
        resource: str,
        required: int,
        reusable: set[str],
        affinity: NumaMask | None,
        assignment: ContainerAssignment,
    ) -> set[str]:
        """``devicesToAllocate`` (manager.go), including both ``GetPreferredAllocation`` cases."""
        state = self.resources.get(resource)
        if state is None:
            raise unexpected(f"cannot allocate unregistered device {resource}")
        if not state.healthy:
            raise unexpected(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        needed = required
        if needed == 0:
            return set()
        allocated: set[str] = set()

        def take(devices: set[str]) -> bool:
            nonlocal needed
            for device in sorted(devices - allocated):
                allocated.add(device)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(reusable):
            return allocated
        available = state.healthy - self.allocated_devices(resource) - allocated
        if len(available) < needed:
            raise unexpected(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned, unaligned, no_affinity = filter_by_affinity(state.all_devices, available, affinity)
        shortfall = unexpected(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )
        if needed < len(aligned):
            preferred = await self._preferred(
                state, aligned | allocated, set(allocated), required, assignment
            )
            if take(preferred & aligned) or take(aligned):
                return allocated
            raise shortfall
        if take(aligned):
            return allocated
        preferred = await self._preferred(state, available | allocated, set(allocated), required, assignment)
        if take(preferred & available) or take(unaligned) or take(no_affinity):
            return allocated
        raise shortfall

    async def _preferred(
        self,
        state: ResourceState,
        available: set[str],
        must_include: set[str],
        size: int,
        assignment: ContainerAssignment,
    ) -> set[str]:
        """``callGetPreferredAllocationIfAvailable``."""
        endpoint = state.endpoint
        if endpoint is None or endpoint.stopped:
            raise unexpected(
                "device plugin GetPreferredAllocation rpc failed with err: "
                f"endpoint {state.name} has been stopped"
            )
        if not endpoint.options.get_preferred_allocation_available:
            return set()
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted(available),
                    must_include_deviceIDs=sorted(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await endpoint.preferred(request)
        except RPC_ERRORS as exc:
            raise unexpected(
                f"device plugin GetPreferredAllocation rpc failed with err: {rpc_error_text(exc)}"
            ) from exc
        answer = tuple(response.container_responses[0].deviceIDs) if response.container_responses else ()
        assignment.preferred_calls.append(
            PreferredCall(state.name, tuple(sorted(available)), tuple(sorted(must_include)), size, answer)
        )
        self._check_preferred(state.name, available, must_include, size, answer)
        return set(answer)

    def _check_preferred(
        self, resource: str, available: set[str], must_include: set[str], size: int, answer: tuple[str, ...]
    ) -> None:
        """Log the answer; kubelet does not refuse a contract-breaking one (it intersects and tops up)."""
        outside = sorted(set(answer) - available)
        missing = sorted(must_include - set(answer))
        if not answer:
            self._log.debug("preferred_allocation_no_preference", resource=resource, size=size)
        elif outside or missing or len(answer) != size:
            self._log.warning(
                "preferred_allocation_breaks_contract",
                resource=resource,
                outside_offered=outside,
                missing_must_include=missing,
                size=len(answer),
                expected_size=size,
            )
        self._log.info(
            "preferred_allocation_called",
            resource=resource,
            available=sorted(available),
            must_include=sorted(must_include),
            size=size,
            answer=list(answer),
        )

    async def _allocate_rpc(self, resource: str, devices: set[str]) -> pb.ContainerAllocateResponse:
        endpoint = self.resources[resource].endpoint
        if endpoint is None or endpoint.stopped:
            raise unexpected(f"endpoint {resource} has been stopped")
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=sorted(devices))]
        )
        try:
            response = await endpoint.allocate(request)
        except RPC_ERRORS as exc:
            raise unexpected(rpc_error_text(exc)) from exc
        if not response.container_responses:
            raise unexpected(f"no containers return in allocation response {response}")
        self._log.info("allocate_called", resource=resource, devices=sorted(devices))
        first: pb.ContainerAllocateResponse = response.container_responses[0]
        return first

    async def pre_start(self, containers: Iterable[ContainerAssignment]) -> str | None:
        """``PreStartContainer`` for each container with devices when the plugin asks; error text or None."""
        for assignment in containers:
            for resource, devices in assignment.devices.items():
                state = self.resources.get(resource)
                endpoint = None if state is None else state.endpoint
                if endpoint is None or not endpoint.options.pre_start_required:
                    continue
                try:
                    await endpoint.pre_start(list(devices))
                except RPC_ERRORS as exc:
                    return f"device plugin PreStartContainer rpc failed with err: {rpc_error_text(exc)}"
        return None

"""kubelet's PodResources API v1 (``pkg/kubelet/apis/podresources``): ``List``,
``GetAllocatableResources`` and ``Get`` over a unix socket, answered from the same records the
assignment annotation is written from, so the two always agree.

A pod's containers are those kubelet's ``List`` and ``Get`` walk (``server_v1.go``): restartable
init containers, then ``spec.containers``; a regular init container is never reported, although
kubelet keeps what it was given until the pod ends (SidecarContainers is GA since 1.33, so its
gate's off branch, app containers only, is not modelled). Devices are reported per NUMA node as
kubelet's ``podDevices`` keeps them (devices without topology under node -1); ``cpu_ids`` are
exclusive CPUs only; ``memory`` is the Static memory manager's blocks (and, in
``GetAllocatableResources``, its allocatable memory per NUMA node; empty with policy None).
"""

# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Server, Stream

from hamid._proto.podresources.v1 import api_pb2 as pr
from hamid._proto.podresources.v1.api_grpc import PodResourcesListerBase
from hamidsim.kubelet.assignment import PodAdmission
from hamidsim.kubelet.devicemanager import NODE_WITHOUT_TOPOLOGY, DeviceTopology, ResourceState

POD_RESOURCES_SOCKET = "kubelet.sock"


def default_socket(device_plugin_root: str | Path) -> Path:
    """kubelet's layout: ``<root>/../pod-resources/kubelet.sock`` for a device-plugin dir ``<root>``."""
    return Path(device_plugin_root).parent / "pod-resources" / POD_RESOURCES_SOCKET


def _per_numa(
    resource: str, devices: Iterable[str], topology: Mapping[str, DeviceTopology]
) -> list[pr.ContainerDevices]:
    """``getContainerDevices``: one entry per NUMA node, device IDs in order."""
    by_node: dict[int, list[str]] = {}
    for device in sorted(devices):
        for node in topology.get(device) or (NODE_WITHOUT_TOPOLOGY,):
            by_node.setdefault(node, []).append(device)
    return [
        pr.ContainerDevices(
            resource_name=resource, device_ids=ids, topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)])
        )
        for node, ids in sorted(by_node.items())
    ]


def _allocatable_devices(resources: Mapping[str, ResourceState]) -> list[pr.ContainerDevices]:
    """``GetAllocatableDevices``: every healthy device, one entry per device and NUMA node."""
    result: list[pr.ContainerDevices] = []
    for name in sorted(resources):
        state = resources[name]
        for device in sorted(state.healthy):
            topo = state.all_devices.get(device)
            if not topo:
                result.append(pr.ContainerDevices(resource_name=name, device_ids=[device]))
                continue
            for node in topo:
                result.append(
                    pr.ContainerDevices(
                        resource_name=name,
                        device_ids=[device],
                        topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
                    )
                )
    return result


def _numa(nodes: Iterable[int]) -> pr.TopologyInfo:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n) for n in nodes])


class PodResourcesView:
    """What the server reads: active pod records, device state and the allocatable CPUs."""

    def __init__(
        self,
        active: Callable[[], list[PodAdmission]],
        resources: Callable[[], Mapping[str, ResourceState]],
        allocatable_cpus: Callable[[], frozenset[int]],
        device_topology: Callable[[str], Mapping[str, DeviceTopology]],
        allocatable_memory: Callable[[], list[tuple[int, str, int]]] = list,
    ) -> None:
        self.active = active
        self.resources = resources
        self.allocatable_cpus = allocatable_cpus
        self.device_topology = device_topology
        #: (NUMA node, memory type, bytes) the Static memory manager may pin (empty with None).
        self.allocatable_memory = allocatable_memory

    def pod(self, record: PodAdmission) -> pr.PodResources:
        """One pod's resources: every container kubelet reports, also those holding nothing."""
        containers = []
        for c in record.containers:
            if c.init and not c.restartable:
                continue  # kubelet's List skips regular init containers
            devices = [
                d for r in sorted(c.devices) for d in _per_numa(r, c.devices[r], self.device_topology(r))
            ]
            memory = [
                pr.ContainerMemory(memory_type=t, size=size, topology=_numa(nodes))
                for t, (nodes, size) in sorted(c.memory.items())
            ]
            containers.append(
                pr.ContainerResources(name=c.name, devices=devices, cpu_ids=sorted(c.cpus), memory=memory)
            )
        return pr.PodResources(name=record.name, namespace=record.namespace, containers=containers)


class _Lister(PodResourcesListerBase):
    def __init__(self, view: PodResourcesView) -> None:
        self.view = view

    async def List(self, stream: Stream[pr.ListPodResourcesRequest, pr.ListPodResourcesResponse]) -> None:
        await stream.recv_message()
        pods = [self.view.pod(r) for r in sorted(self.view.active(), key=lambda r: r.key)]
        await stream.send_message(pr.ListPodResourcesResponse(pod_resources=pods))

    async def GetAllocatableResources(
        self, stream: Stream[pr.AllocatableResourcesRequest, pr.AllocatableResourcesResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(
            pr.AllocatableResourcesResponse(
                devices=_allocatable_devices(self.view.resources()),
                cpu_ids=sorted(self.view.allocatable_cpus()),
                memory=[
                    pr.ContainerMemory(memory_type=t, size=size, topology=_numa((n,)))
                    for n, t, size in self.view.allocatable_memory()
                ],
            )
        )

    async def Get(self, stream: Stream[pr.GetPodResourcesRequest, pr.GetPodResourcesResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        for record in self.view.active():
            if record.name == request.pod_name and record.namespace == request.pod_namespace:
                await stream.send_message(pr.GetPodResourcesResponse(pod_resources=self.view.pod(record)))
                return
        raise GRPCError(
            Status.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )


class PodResourcesServer:
    """The PodResources gRPC server on its unix socket."""

    def __init__(self, socket: Path, view: PodResourcesView) -> None:
        self.socket = socket
        self._view = view
        self._server: Server | None = None

    async def start(self) -> None:
        """Create the directory (0750, like kubelet) and serve, replacing a stale socket."""
        await asyncio.to_thread(self.socket.parent.mkdir, mode=0o750, parents=True, exist_ok=True)
        await asyncio.to_thread(self.socket.unlink, missing_ok=True)
        server = Server([_Lister(self._view)])
        await server.start(path=str(self.socket))
        self._server = server

    async def stop(self, timeout: float) -> None:
        """Stop serving and remove the socket."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await server.wait_closed()
        await asyncio.to_thread(self.socket.unlink, missing_ok=True)

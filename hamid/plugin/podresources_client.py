"""A client of kubelet's PodResources API v1 (``v1.PodResourcesLister``) on its unix socket.

``GetAllocatableResources`` gives the CPUs the static CPU manager may hand out (all online CPUs
minus the reserved ones) and ``List`` what every admitted pod's containers hold: exclusive CPUs
and device IDs with the NUMA nodes their device plugin advertised. Answers are turned into plain
records here so nothing else sees protobuf. kubelet rate-limits the API (QPS 100, burst 10), so
callers poll it at most about once a second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from grpclib import GRPCError
from grpclib.client import Channel

from hamid._proto.podresources.v1 import api_pb2 as pr
from hamid._proto.podresources.v1.api_grpc import PodResourcesListerStub
from hamid.model.numa import NO_TOPOLOGY, MemoryBlock

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: resource name -> NUMA node (or NO_TOPOLOGY) -> device IDs.
DevicesByNuma = Mapping[str, Mapping[int, tuple[str, ...]]]


class PodResourcesUnavailable(Exception):
    """The PodResources API did not answer usably (no socket, refused, gRPC error, timeout, an answer
    that does not decode): every failure but cancellation, so a kubelet answering badly costs the
    NUMA annotations only, never the device plugin."""


@dataclass(frozen=True, slots=True)
class HeldContainer:
    """What one container holds: its exclusive CPUs and its devices per resource and NUMA node."""

    name: str
    cpus: frozenset[int]
    devices: DevicesByNuma = field(default_factory=dict)
    #: The Static memory manager's blocks (empty under policy None), sorted by memory type.
    memory: tuple[MemoryBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class HeldPod:
    """One pod kubelet reports as active."""

    namespace: str
    name: str
    containers: tuple[HeldContainer, ...]

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Allocatable:
    """``GetAllocatableResources``: exclusive-allocatable CPUs and every healthy device."""

    cpus: frozenset[int]
    devices: DevicesByNuma
    #: Allocatable bytes per NUMA node and memory type (the Static memory manager's; else empty).
    memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)


def _memory_blocks(entries: Iterable[pr.ContainerMemory]) -> tuple[MemoryBlock, ...]:
    blocks = [
        MemoryBlock(frozenset(int(n.ID) for n in m.topology.nodes), m.memory_type, int(m.size))
        for m in entries
    ]
    return tuple(sorted(blocks, key=lambda b: b.resource))


def _allocatable_memory(entries: Iterable[pr.ContainerMemory]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for m in entries:
        for n in m.topology.nodes:
            per = out.setdefault(int(n.ID), {})
            per[m.memory_type] = per.get(m.memory_type, 0) + int(m.size)
    return out


def _devices(entries: Iterable[pr.ContainerDevices]) -> dict[str, dict[int, tuple[str, ...]]]:
    grouped: dict[str, dict[int, list[str]]] = {}
    for entry in entries:
        nodes = [n.ID for n in entry.topology.nodes] if entry.HasField("topology") else []
        for node in nodes or [NO_TOPOLOGY]:
            into = grouped.setdefault(entry.resource_name, {}).setdefault(int(node), [])
            into.extend(d for d in entry.device_ids if d not in into)
    return {res: {n: tuple(ids) for n, ids in sorted(per.items())} for res, per in sorted(grouped.items())}


def held_pod(message: pr.PodResources) -> HeldPod:
    """One pod of a ``List`` answer as plain records (the simulator's answers are read so too)."""
    containers = tuple(
        HeldContainer(
            c.name, frozenset(int(x) for x in c.cpu_ids), _devices(c.devices), _memory_blocks(c.memory)
        )
        for c in message.containers
    )
    return HeldPod(message.namespace, message.name, containers)


class PodResourcesClient:
    """``List`` and ``GetAllocatableResources`` with a deadline; a fresh channel per call, so a
    restarted kubelet (a new socket) is picked up without reconnect logic."""

    def __init__(self, socket: str = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout

    async def _call(self, method: str, request: object) -> object:
        channel = Channel(path=self.socket)
        try:
            stub = PodResourcesListerStub(channel)
            return await getattr(stub, method)(request, timeout=self.timeout)
        except GRPCError as exc:
            raise PodResourcesUnavailable(f"{method}: {exc.status.name}: {exc.message}") from exc
        except Exception as exc:  # no socket, a timeout, an answer that does not decode: unavailable
            why = ": ".join(filter(None, (type(exc).__name__, getattr(exc, "strerror", None) or str(exc))))
            raise PodResourcesUnavailable(f"{method} on {self.socket}: {why}") from exc
        finally:
            channel.close()

    async def allocatable(self) -> Allocatable:
        """The node's allocatable CPUs and devices."""
        reply = await self._call("GetAllocatableResources", pr.AllocatableResourcesRequest())
        assert isinstance(reply, pr.AllocatableResourcesResponse)
        cpus = frozenset(int(c) for c in reply.cpu_ids)
        return Allocatable(cpus, _devices(reply.devices), _allocatable_memory(reply.memory))

    async def list_pods(self) -> list[HeldPod]:
        """Every pod kubelet considers active, with what its containers hold."""
        reply = await self._call("List", pr.ListPodResourcesRequest())
        assert isinstance(reply, pr.ListPodResourcesResponse)
        return [held_pod(p) for p in reply.pod_resources]

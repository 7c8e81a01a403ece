"""CPU and memory as kube-scheduler's NodeResourcesFit counts them: a pod's request, a node's room.

hamid's own reading (the simulator keeps its own, as the oracle): a pod needs the larger of its
long-running containers (app containers plus sidecars) and its heaviest regular init container
(plus the sidecars started before it), plus ``spec.overhead``; a node's room is its allocatable
minus the requests of every pod bound to it. Pure: the scheduler feeds it from its caches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hamid.model.errors import InvalidInput
from hamid.model.quantity import parse_quantity
from hamid.model.resources import is_sidecar

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class CpuMem:
    """milli-CPUs and bytes of memory (a request, an allocatable or a room)."""

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: CpuMem) -> CpuMem:
        return CpuMem(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: CpuMem) -> CpuMem:
        return CpuMem(self.cpu - other.cpu, self.memory - other.memory)

    def max(self, other: CpuMem) -> CpuMem:
        """The larger of each dimension."""
        return CpuMem(max(self.cpu, other.cpu), max(self.memory, other.memory))

    @property
    def memory_mib(self) -> int:
        """Memory in MiB, rounded down (a room) — requests use :attr:`memory_mib_up`."""
        return self.memory // _MIB

    @property
    def memory_mib_up(self) -> int:
        """Memory in MiB, rounded up."""
        return -(-self.memory // _MIB)


@functools.lru_cache(maxsize=4096)
def _scaled_text(value: str, where: str, scale: int) -> int:
    return math.ceil(parse_quantity(value, where) * scale)


def _scaled(value: object, where: str, scale: int) -> int:
    """A quantity times ``scale``, rounded up (texts memoised: pods repeat a few amounts)."""
    if isinstance(value, str):
        return _scaled_text(value, where, scale)
    return math.ceil(parse_quantity(value, where) * scale)


def _amounts(values: object, where: str) -> CpuMem:
    if not isinstance(values, Mapping):
        return CpuMem()
    cpu = values.get("cpu")
    memory = values.get("memory")
    return CpuMem(
        0 if cpu is None else _scaled(cpu, f"{where}.cpu", 1000),
        0 if memory is None else _scaled(memory, f"{where}.memory", 1),
    )


def container_cpu_mem(container: Mapping[str, Any]) -> CpuMem:
    """A container's requests (a resource only in ``limits`` defaults its request to the limit)."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return CpuMem()
    requests, limits = resources.get("requests"), resources.get("limits")
    merged = {
        **(limits if isinstance(limits, Mapping) else {}),
        **(requests if isinstance(requests, Mapping) else {}),
    }
    return _amounts(merged, "resources.requests")


def pod_cpu_mem(pod: Mapping[str, Any]) -> CpuMem:
    """kube-scheduler's pod request for cpu and memory (InvalidInput on a bad quantity)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return CpuMem()
    total = CpuMem()
    for container in spec.get("containers") or ():
        if isinstance(container, Mapping):
            total = total + container_cpu_mem(container)
    sidecars = CpuMem()
    init_peak = CpuMem()
    for container in spec.get("initContainers") or ():
        if not isinstance(container, Mapping):
            continue
        requests = container_cpu_mem(container)
        if is_sidecar(container):
            total = total + requests
            sidecars = sidecars + requests
        else:
            init_peak = init_peak.max(requests + sidecars)
    return total.max(init_peak) + _amounts(spec.get("overhead"), "spec.overhead")


def node_allocatable(node: Mapping[str, Any]) -> CpuMem | None:
    """A node's allocatable cpu and memory; None when it publishes neither (or a bad quantity)."""
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or not ("cpu" in allocatable or "memory" in allocatable):
        return None
    try:
        return _amounts(allocatable, "status.allocatable")
    except InvalidInput:
        return None


def is_guaranteed(pod: Mapping[str, Any]) -> bool:
    """Guaranteed QoS: every container limits cpu and memory and requests no other amount."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    if not containers:
        return False
    for container in containers:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            return False
        limits, requests = resources.get("limits"), resources.get("requests") or {}
        if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
            return False
        for name in ("cpu", "memory"):
            if name not in limits:
                return False
            if name in requests and parse_quantity(requests[name], name) != parse_quantity(
                limits[name], name
            ):
                return False
    return True

"""Building the node's managers from the machine and the kubelet configuration, with kubelet's
start-up refusals (``container_manager_linux.go``, ``cpumanager.NewManager``,
``topologymanager.NewManager``), and the node status they publish (``nodestatus/setters.go``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamidsim.kubelet.admission import TopologySettings
from hamidsim.kubelet.cadvisor import MachineInfo, format_cpu_list
from hamidsim.kubelet.config import KubeletConfig
from hamidsim.kubelet.cpumanager import (
    CPU_POLICIES,
    CPU_POLICY_NONE,
    CPU_POLICY_STATIC,
    CpuManager,
    StaticPolicy,
    StaticPolicyOptions,
    parse_cpu_options,
    validate_cpu_options,
)
from hamidsim.kubelet.devicemanager import DeviceManager
from hamidsim.kubelet.memorymanager import (
    MEMORY,
    MEMORY_POLICY_STATIC,
    StaticMemoryPolicy,
    check_memory_manager,
    eviction_memory,
    hugepages_resource,
    system_reserved_memory,
)
from hamidsim.kubelet.quantity import quantity_value
from hamidsim.kubelet.status import now_text
from hamidsim.kubelet.topologymanager import check_manager, parse_policy_options

STATIC_NEEDS_RESERVATION = (
    "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
)


def reserved_cpus(
    machine: MachineInfo, config: KubeletConfig, options: StaticPolicyOptions | None = None
) -> frozenset[int]:
    """``reservedSystemCPUs``, else the machine file's ``reservedCpus``, else kubelet's pick of
    ``kubeReserved.cpu + systemReserved.cpu`` CPUs (the static policy's ``takeByTopology`` over
    all CPUs, with its options)."""
    if config.reserved_system_cpus:
        reserved = config.reserved_system_cpus
    elif machine.reserved_cpus:
        reserved = machine.reserved_cpus
    elif config.reserved_cpu_count:
        policy = StaticPolicy(machine.cpu_topology, frozenset(), options or StaticPolicyOptions())
        reserved = policy.take(machine.all_cpus, config.reserved_cpu_count)
    else:
        return frozenset()
    outside = reserved - machine.all_cpus
    if outside:
        raise InvalidInput(f"reserved CPUs {format_cpu_list(outside)} are not CPUs of this machine")
    if reserved == machine.all_cpus:
        raise InvalidInput("the reserved CPUs cover every CPU; nothing is left for pods")
    return reserved


def build_managers(machine: MachineInfo, config: KubeletConfig) -> tuple[CpuManager, TopologySettings]:
    """The CPU manager and the Topology Manager's settings; InvalidInput with kubelet's reason."""
    options = parse_policy_options(config.topology_manager_policy_options)
    check_manager(machine.numa_ids, config.topology_manager_policy, config.topology_manager_scope, options)
    policy = config.cpu_manager_policy
    if policy not in CPU_POLICIES:
        raise InvalidInput(f'unknown policy: "{policy}"')
    cpu_options = StaticPolicyOptions()
    if policy == CPU_POLICY_NONE and config.cpu_manager_policy_options:
        listed = " ".join(f"{k}:{v}" for k, v in sorted(config.cpu_manager_policy_options.items()))
        raise InvalidInput(f"None policy: received unsupported options=map[{listed}]")
    if policy == CPU_POLICY_STATIC:
        if not (config.reserved_system_cpus or machine.reserved_cpus or config.reserved_cpu_count):
            raise InvalidInput(STATIC_NEEDS_RESERVATION)
        cpu_options = parse_cpu_options(config.cpu_manager_policy_options)
    reserved = reserved_cpus(machine, config, cpu_options)
    if policy == CPU_POLICY_STATIC:
        validate_cpu_options(cpu_options, machine.cpu_topology, config.topology_manager_policy)
    check_memory_manager(config.memory_manager_policy)
    distance = machine.distance if options.prefer_closest else None
    settings = TopologySettings(
        config.topology_manager_policy, config.topology_manager_scope, tuple(machine.numa_ids), distance
    )
    return CpuManager(machine.cpu_topology, policy, reserved, cpu_options), settings


def build_memory_manager(machine: MachineInfo, config: KubeletConfig) -> StaticMemoryPolicy | None:
    """The Static memory manager (None with policy None); InvalidInput with kubelet's reason.

    ``reservedMemory`` must add up, per memory type, to node allocatable's reservation: ``kubeReserved``
    + ``systemReserved`` (+ ``evictionHard``'s ``memory.available`` for regular memory).
    """
    check_memory_manager(config.memory_manager_policy)
    if config.memory_manager_policy != MEMORY_POLICY_STATIC:
        return None
    capacity = quantity_value(machine.memory, "machine memory")
    reservation = dict(config.reserved_memory_types)
    eviction = eviction_memory(config.eviction_hard, capacity, "kubelet config")
    reservation[MEMORY] = reservation.get(MEMORY, 0) + eviction
    reserved = system_reserved_memory(machine.numa_ids, config.reserved_memory, reservation)
    return StaticMemoryPolicy.create(machine.memory_per_numa(), reserved)


def hugepages_capacity(machine: MachineInfo) -> dict[str, int]:
    """Bytes of hugepages per ``hugepages-<size>`` resource over all NUMA nodes."""
    result: dict[str, int] = {}
    for node in machine.memory_per_numa():
        for size, pages in node.hugepages:
            name = hugepages_resource(size)
            result[name] = result.get(name, 0) + size * pages
    return result


def node_status(
    machine: MachineInfo,
    config: KubeletConfig,
    cpus: CpuManager,
    devices: tuple[dict[str, int], dict[str, int], set[str]],
    published: Iterable[str],
    node_name: str,
) -> JSON:
    """The node ``status`` (merge-patch form: removed device resources map to None).

    Allocatable CPUs are the machine's minus the reserved ones; memory is reported unreserved, less
    the hugepages (each ``hugepages-<size>`` is a resource of its own).
    """
    capacity, allocatable, deleted = devices
    total = len(machine.all_cpus)
    pods = str(config.max_pods or machine.pods)
    cap: dict[str, Any] = {"cpu": str(total), "memory": machine.memory, "pods": pods}
    alloc: dict[str, Any] = {"cpu": str(total - len(cpus.reserved)), "memory": machine.memory, "pods": pods}
    hugepages = hugepages_capacity(machine)
    if hugepages:
        alloc["memory"] = str(quantity_value(machine.memory, "machine memory") - sum(hugepages.values()))
        for name, size in sorted(hugepages.items()):
            cap[name] = alloc[name] = str(size)
    for name in sorted(capacity):
        cap[name] = str(capacity[name])
        alloc[name] = str(allocatable[name])
    for name in sorted((deleted | set(published)) - set(capacity)):
        cap[name] = None
        alloc[name] = None
    now = now_text()
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    addresses = [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": node_name}]
    return {"capacity": cap, "allocatable": alloc, "conditions": [ready], "addresses": addresses}


class NodeStatusPublisher:
    """Creates the Node if missing and publishes its status on every change and every ``interval``."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        machine: MachineInfo,
        config: KubeletConfig,
        cpus: CpuManager,
        devices: DeviceManager,
        log: Any,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.machine = machine
        self.config = config
        self.cpus = cpus
        self.devices = devices
        self.interval = 10.0
        self._log = log
        self._dirty = asyncio.Event()
        self._published: set[str] = set()

    def mark_dirty(self) -> None:
        """Publish soon (something changed)."""
        self._dirty.set()

    def status(self) -> JSON:
        """The status to publish now."""
        return node_status(
            self.machine,
            self.config,
            self.cpus,
            self.devices.device_capacity(),
            self._published,
            self.node_name,
        )

    async def sync(self) -> JSON:
        """Publish the node status now; returns the node as the API server answered."""
        status = self.status()
        node = await self.kube.patch_node_status(self.node_name, status)
        self._published = {
            k for k, v in status["capacity"].items() if v is not None and not k.startswith("hugepages-")
        } - {"cpu", "memory", "pods"}
        return node

    async def ensure_node(self) -> None:
        """Create the Node object if it does not exist, then publish its status."""
        try:
            await self.kube.get_node(self.node_name)
        except NotFound:
            labels = {
                "kubernetes.io/hostname": self.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }
            with contextlib.suppress(KubeError):
                await self.kube.create_node(
                    {"metadata": {"name": self.node_name, "labels": labels}, "spec": {}}
                )
        await self.sync()

    async def run(self) -> None:
        """Publish on each change, and at least every ``interval`` seconds."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.sync()
            except KubeError as exc:
                self._log.warning("node_status_update_failed", error=str(exc))

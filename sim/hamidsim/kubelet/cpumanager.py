"""kubelet's CPU manager (``pkg/kubelet/cm/cpumanager``): the ``none`` and ``static`` policies.

The static policy gives each container of a Guaranteed pod with an integer CPU request exclusive
CPUs: hints per NUMA mask (``generateCPUTopologyHints``), CPUs inside the Topology Manager's hint
first (``allocateCPUs``), picked by :mod:`hamidsim.kubelet.cpu_assignment`. Policy options:
``full-pcpus-only`` (whole cores or ``SMTAlignmentError``), ``distribute-cpus-across-numa``,
``align-by-socket``, ``strict-cpu-reservation``, ``distribute-cpus-across-cores`` and
``prefer-align-cpus-by-uncorecache`` (uncore caches from the machine's L3 cache ids).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.cadvisor import CpuTopology
from hamidsim.kubelet.cpu_assignment import (
    CpuAllocationError,
    take_by_topology,
    take_by_topology_distributed,
)
from hamidsim.kubelet.podutil import container_requests, is_restartable_init, pod_containers, pod_qos_class
from hamidsim.kubelet.quantity import quantity_milli_value, quantity_value
from hamidsim.kubelet.topologymanager import (
    POLICY_SINGLE_NUMA_NODE,
    NumaMask,
    TopologyHint,
    iterate_masks,
    parse_go_bool,
)

CPU_POLICY_NONE = "none"
CPU_POLICY_STATIC = "static"
CPU_POLICIES = (CPU_POLICY_NONE, CPU_POLICY_STATIC)
OPTION_FULL_PCPUS_ONLY = "full-pcpus-only"
OPTION_DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
OPTION_ALIGN_BY_SOCKET = "align-by-socket"
OPTION_STRICT_CPU_RESERVATION = "strict-cpu-reservation"
OPTION_DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
OPTION_ALIGN_BY_UNCORE_CACHE = "prefer-align-cpus-by-uncorecache"
CPU_OPTIONS = (
    OPTION_FULL_PCPUS_ONLY,
    OPTION_DISTRIBUTE_ACROSS_NUMA,
    OPTION_ALIGN_BY_SOCKET,
    OPTION_STRICT_CPU_RESERVATION,
    OPTION_DISTRIBUTE_ACROSS_CORES,
    OPTION_ALIGN_BY_UNCORE_CACHE,
)
#: Options ``NewStaticPolicyOptions`` refuses together (kubelet's order of checks).
EXCLUSIVE_OPTIONS = (
    (OPTION_FULL_PCPUS_ONLY, OPTION_DISTRIBUTE_ACROSS_CORES),
    (OPTION_DISTRIBUTE_ACROSS_NUMA, OPTION_DISTRIBUTE_ACROSS_CORES),
    (OPTION_ALIGN_BY_UNCORE_CACHE, OPTION_DISTRIBUTE_ACROSS_CORES),
    (OPTION_ALIGN_BY_UNCORE_CACHE, OPTION_DISTRIBUTE_ACROSS_NUMA),
)
REASON_SMT_ALIGNMENT = "SMTAlignmentError"


class SMTAlignmentError(Exception):
    """``SMTAlignmentError``: with ``full-pcpus-only`` a container must get whole physical cores."""

    reason = REASON_SMT_ALIGNMENT

    def __init__(self, requested: int, per_core: int, available_physical: int | None = None) -> None:
        if available_physical is None:
            text = f"SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {per_core}"
        else:
            text = (
                "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
                f"{available_physical}, requested CPUs = {requested}, CPUs per core = {per_core}"
            )
        super().__init__(text)
        self.message = text


@dataclass(frozen=True, slots=True)
class StaticPolicyOptions:
    """``StaticPolicyOptions`` (the modelled ones)."""

    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    align_by_socket: bool = False
    #: ``strict-cpu-reservation``: the reserved CPUs leave the shared pool too.
    strict_cpu_reservation: bool = False
    #: ``distribute-cpus-across-cores``: CPU sorting strategy spread.
    distribute_across_cores: bool = False
    #: ``prefer-align-cpus-by-uncorecache``: whole uncore (L3) caches before whole cores.
    align_by_uncore_cache: bool = False


def parse_cpu_options(options: Mapping[str, str]) -> StaticPolicyOptions:
    """``NewStaticPolicyOptions``: kubelet's errors for unknown options and non-boolean values."""
    values: dict[str, bool] = {}
    for name in sorted(options):
        if name not in CPU_OPTIONS:
            raise InvalidInput(f'unknown CPU Manager Policy option: "{name}"')
        values[name] = parse_go_bool(name, options[name])
    for a, b in EXCLUSIVE_OPTIONS:
        if values.get(a) and values.get(b):
            raise InvalidInput(f"static policy options {a} and {b} can not be used at the same time")
    return StaticPolicyOptions(
        full_pcpus_only=values.get(OPTION_FULL_PCPUS_ONLY, False),
        distribute_across_numa=values.get(OPTION_DISTRIBUTE_ACROSS_NUMA, False),
        align_by_socket=values.get(OPTION_ALIGN_BY_SOCKET, False),
        strict_cpu_reservation=values.get(OPTION_STRICT_CPU_RESERVATION, False),
        distribute_across_cores=values.get(OPTION_DISTRIBUTE_ACROSS_CORES, False),
        align_by_uncore_cache=values.get(OPTION_ALIGN_BY_UNCORE_CACHE, False),
    )


def validate_cpu_options(options: StaticPolicyOptions, topo: CpuTopology, topology_policy: str) -> None:
    """``ValidateStaticPolicyOptions``: align-by-socket against the machine and the TM policy."""
    if not options.align_by_socket:
        return
    if topology_policy == POLICY_SINGLE_NUMA_NODE:
        raise InvalidInput(
            f"Topolgy manager {POLICY_SINGLE_NUMA_NODE} policy is incompatible with CPUManager "
            f"{OPTION_ALIGN_BY_SOCKET} policy option"
        )
    if len(topo.sockets) > len(topo.numa_nodes):
        raise InvalidInput(
            "Align by socket is not compatible with hardware where number of sockets are more than "
            "number of NUMA"
        )


def guaranteed_cpus(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int:
    """The static policy's ``guaranteedCPUs``: integer CPU request of a Guaranteed pod's container, else 0."""
    if pod_qos_class(pod) != "Guaranteed":
        return 0
    raw = container_requests(container).get("cpu")
    if raw is None:
        return 0
    where = f"container {container.get('name')!r} requests.cpu"
    value = quantity_value(raw, where)
    if value * 1000 != quantity_milli_value(raw, where):
        return 0
    return value


def pod_guaranteed_cpus(pod: Mapping[str, Any]) -> int:
    """``podGuaranteedCPUs``: the larger of the init peak (with earlier sidecars) and the long-running sum."""
    init_peak = sidecars = app = 0
    for container, is_init in pod_containers(pod):
        if "cpu" not in container_requests(container):
            continue
        cpus = guaranteed_cpus(pod, container)
        if not is_init:
            app += cpus
        elif is_restartable_init(container):
            sidecars += cpus
        else:
            init_peak = max(init_peak, sidecars + cpus)
    return max(init_peak, app + sidecars)


def generate_cpu_hints(
    topology: CpuTopology,
    available: Iterable[int],
    reusable: Iterable[int],
    request: int,
    align_by_socket: bool = False,
) -> list[TopologyHint]:
    """``generateCPUTopologyHints`` (with ``align-by-socket``'s preferred socket-aligned masks)."""
    node_of = {cpu: info.numa for cpu, info in topology.details.items()}
    total = {n: len(cpus) for n, cpus in topology.numa_cpus.items()}
    free = Counter(node_of[c] for c in set(available) if c in node_of)
    reusable_set = set(reusable)
    reusable_nodes = {node_of.get(c) for c in reusable_set}
    min_affinity_size = len(topology.numa_nodes)
    found: list[NumaMask] = []
    for mask in iterate_masks(topology.numa_nodes):
        if sum(total[n] for n in mask) >= request and len(mask) < min_affinity_size:
            min_affinity_size = len(mask)
        if not reusable_nodes <= mask:
            continue
        if len(reusable_set) + sum(free[n] for n in mask) >= request:
            found.append(mask)
    per_socket = len(topology.numa_nodes) // len(topology.sockets)

    def preferred(mask: NumaMask) -> bool:
        if align_by_socket and per_socket:
            min_sockets = (min_affinity_size + per_socket - 1) // per_socket
            if len(topology.sockets_in_numa(mask)) == min_sockets:
                return True
        return len(mask) == min_affinity_size

    return [TopologyHint(mask, preferred(mask)) for mask in found]


class StaticPolicy:
    """The static policy's picks (``allocateCPUs`` / ``takeByTopology``) on one machine."""

    def __init__(self, topology: CpuTopology, reserved: frozenset[int], options: StaticPolicyOptions) -> None:
        self.topology = topology
        self.reserved = reserved
        self.options = options
        #: ``reservedPhysicalCPUs``: reserved CPUs and their thread siblings (full-pcpus-only).
        self.reserved_physical = topology.siblings(reserved) if options.full_pcpus_only else reserved

    def take(self, available: Iterable[int], count: int) -> frozenset[int]:
        """``takeByTopology``: distributed across NUMA or packed, per the options."""
        if self.options.distribute_across_numa:
            group = self.topology.cpus_per_core() if self.options.full_pcpus_only else 1
            return take_by_topology_distributed(self.topology, available, count, group)
        opts = self.options
        return take_by_topology(
            self.topology, available, count, opts.distribute_across_cores, opts.align_by_uncore_cache
        )

    def check_smt(self, count: int, default_set: frozenset[int]) -> None:
        """``full-pcpus-only``: a multiple of the threads per core and enough whole free cores."""
        if not self.options.full_pcpus_only:
            return
        per_core = self.topology.cpus_per_core()
        if count % per_core:
            raise SMTAlignmentError(count, per_core)
        physical = len(default_set - self.reserved_physical)
        if count > physical:
            raise SMTAlignmentError(count, per_core, physical)

    def aligned(self, affinity: NumaMask, allocatable: frozenset[int]) -> frozenset[int]:
        """``getAlignedCPUs``: the hint's NUMA nodes (or their whole sockets with align-by-socket)."""
        if self.options.align_by_socket:
            return allocatable & self.topology.cpus_in_sockets(self.topology.sockets_in_numa(affinity))
        return allocatable & self.topology.cpus_in(affinity)

    def allocate(self, count: int, affinity: NumaMask | None, allocatable: Iterable[int]) -> frozenset[int]:
        """``allocateCPUs``: CPUs aligned with the hint first, then any others."""
        allocatable_set = frozenset(allocatable)
        result: frozenset[int] = frozenset()
        if affinity is not None:
            aligned = self.aligned(affinity, allocatable_set)
            result = self.take(aligned, min(count, len(aligned)))
        if count > len(result):
            result |= self.take(allocatable_set - result, count - len(result))
        return result


class CpuManager:
    """The CPU manager's state (``cpu_manager_state``): exclusive CPUs per pod and container."""

    def __init__(
        self, topology: CpuTopology, policy: str, reserved: frozenset[int], options: StaticPolicyOptions
    ) -> None:
        self.topology = topology
        self.policy_name = policy
        self.static = StaticPolicy(topology, reserved, options) if policy == CPU_POLICY_STATIC else None
        self.reserved = reserved
        self.assignments: dict[str, dict[str, frozenset[int]]] = {}

    def default_set(self) -> frozenset[int]:
        """The shared pool: every CPU no container holds exclusively (``validateState``: without the
        reserved CPUs under ``strict-cpu-reservation``)."""
        taken = frozenset().union(
            *(c for containers in self.assignments.values() for c in containers.values())
        )
        strict = self.static is not None and self.static.options.strict_cpu_reservation
        return self.topology.cpus - taken - (self.reserved if strict else frozenset())

    def available(self) -> frozenset[int]:
        """``GetAvailableCPUs``: the shared pool minus the reserved CPUs."""
        return self.default_set() - self.reserved

    def allocatable(self) -> frozenset[int]:
        """``GetAllocatableCPUs``: what the static policy may ever hand out (empty with policy none)."""
        return self.topology.cpus - self.reserved if self.static is not None else frozenset()

    def requested(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> int:
        """Exclusive CPUs this container gets (0 with policy none or outside Guaranteed integer CPUs)."""
        return guaranteed_cpus(pod, container) if self.static is not None else 0

    def pod_requested(self, pod: Mapping[str, Any]) -> int:
        """Exclusive CPUs the whole pod needs (pod scope)."""
        return pod_guaranteed_cpus(pod) if self.static is not None else 0

    def hints(
        self, request: int, reusable: Iterable[int], allocated: frozenset[int] | None
    ) -> list[TopologyHint]:
        """``GetTopologyHints``: regenerated from ``allocated`` when the container already holds CPUs."""
        assert self.static is not None
        align = self.static.options.align_by_socket
        if allocated is not None:
            if len(allocated) != request:
                return []
            return generate_cpu_hints(self.topology, allocated, (), request, align)
        return generate_cpu_hints(self.topology, self.available(), reusable, request, align)

    def pod_hints(self, pod: Mapping[str, Any], uid: str) -> list[TopologyHint] | None:
        """``GetPodTopologyHints``: None without a request; no hints at all (``[]``) as soon as one
        container holds exclusive CPUs in a number other than it requests; the held CPUs'
        own hints when together they are the pod's request; else held CPUs count as reusable."""
        request = self.pod_requested(pod)
        if not request:
            return None
        held = self.assignments.get(uid, {})
        assigned: frozenset[int] = frozenset()
        for container, _init in pod_containers(pod):
            allocated = held.get(str(container.get("name") or ""))
            if allocated is None:
                continue
            if len(allocated) != self.requested(pod, container):
                return []
            assigned |= allocated
        if len(assigned) == request:
            return self.hints(request, (), assigned)
        return self.hints(request, assigned, None)

    def allocate(
        self, uid: str, name: str, request: int, affinity: NumaMask | None, reusable: frozenset[int]
    ) -> frozenset[int]:
        """The static policy's ``Allocate``; SMTAlignmentError or CpuAllocationError when it cannot."""
        assert self.static is not None
        held = self.assignments.get(uid, {}).get(name)
        if held is not None:
            return held
        self.static.check_smt(request, self.default_set())
        cpus = self.static.allocate(request, affinity, self.available() | reusable)
        self.assignments.setdefault(uid, {})[name] = cpus
        return cpus

    def release(self, uid: str) -> bool:
        """Give the pod's CPUs back to the shared pool; True if it held any."""
        return bool(self.assignments.pop(uid, None))


def allocate_cpus(
    topology: CpuTopology, count: int, affinity: NumaMask | None, allocatable: Iterable[int]
) -> frozenset[int]:
    """The static policy's ``allocateCPUs`` without options (for tests and the CPU model)."""
    return StaticPolicy(topology, frozenset(), StaticPolicyOptions()).allocate(count, affinity, allocatable)


__all__ = [
    "CPU_POLICIES",
    "CPU_POLICY_NONE",
    "CPU_POLICY_STATIC",
    "CpuAllocationError",
    "CpuManager",
    "SMTAlignmentError",
    "StaticPolicy",
    "StaticPolicyOptions",
    "allocate_cpus",
    "generate_cpu_hints",
    "guaranteed_cpus",
    "parse_cpu_options",
    "pod_guaranteed_cpus",
    "validate_cpu_options",
]
